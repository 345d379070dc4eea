// Partial rollouts (rl.partial_tokens = 1: every generation is cut after each token and carried
// into later steps) in the disaggregated placement, through `atoll launch`, compared for EQUALITY
// with the same job without the fault:
//  - Belayer's shadow takes over a rollout rank killed mid-round of a step whose batch holds
//    rollouts carried from earlier steps: the shadow loads the pool the dead rank carried into the
//    step (written beside its journals) and re-runs the step over the dead rank's round journals;
//  - a trainer's death stops the job at once naming the trainer (the trainers are one data-parallel
//    group, which Gloo cannot shrink; `--outlive` is only for the ranks the job declared it can
//    lose), and the job resumed from its last checkpoint continues the same trajectories: each
//    trainer's carried pool is in the checkpoint and goes back to the rollout ranks with the first push.
// Both runs are one binary on one machine with one thread per rank, so equal means bit for bit.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "parallel/harness.h"

namespace atl::rl {
namespace {

struct JobRun {
  int rc = -1;
  double seconds = 0;
  std::string out;
  std::map<int64_t, nlohmann::json> rl;  // RL step records by trainer step
  std::string weights;                   // the final checkpoint's model.safetensors
};

JobRun launch(const std::filesystem::path& root, const std::string& name, const std::vector<std::string>& extra,
           int ranks = 4, int steps = 8, int staleness = 0) {
  const std::string atoll = std::string(ATOLL_BINARY_DIR) + "/atoll";
  const std::string cfg = std::string(ATOLL_SOURCE_DIR) + "/configs/rl_add.toml";
  std::vector<std::string> argv = {atoll, "launch", "--nproc-per-node", std::to_string(ranks), "--outlive", "1",
                                   "--timeout", "60", "--", atoll, "train", cfg, "--run.dir=" + (root / name).string(),
                                   "--train.steps=" + std::to_string(steps), "--rl.sft_steps=3", "--rl.prompts=4", "--rl.group_size=4",
                                   "--rl.partial_tokens=1", "--rl.max_staleness=" + std::to_string(staleness), "--eval.every=0", "--sample.every=0",
                                   "--hardware.peak_gflops=1", "--rl.placement=disaggregated", "--rl.rollout_ranks=1",
                                   "--checkpoint.every=4"};
  if (ranks == 4)
    argv.insert(argv.end(), {"--rl.shadow_ranks=1", "--rl.journal_dir=" + (root / (name + "_journal")).string()});
  argv.insert(argv.end(), extra.begin(), extra.end());
  JobRun r;
  const std::string log = (root / (name + ".log")).string();
  const auto t0 = std::chrono::steady_clock::now();
  r.rc = parallel::test::run_command(argv, {"OMP_NUM_THREADS=1"}, log, 180);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.out = parallel::test::read_file(log);
  std::ifstream f(root / name / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") == "rl") r.rl[j.at("step").get<int64_t>()] = j;
  }
  const auto w = root / name / "checkpoints/step_00000008/model.safetensors";
  if (std::filesystem::exists(w)) r.weights = parallel::test::read_file(w.string());
  return r;
}

void expect_equal_steps(const JobRun& a, const JobRun& b, int64_t from) {
  for (const auto& [step, ja] : a.rl) {
    if (step < from) continue;
    ASSERT_TRUE(b.rl.count(step)) << "step " << step;
    const nlohmann::json& jb = b.rl.at(step);
    EXPECT_EQ(ja.at("loss").get<double>(), jb.at("loss").get<double>()) << "step " << step;
    EXPECT_EQ(ja.at("reward").get<double>(), jb.at("reward").get<double>()) << "step " << step;
    if (ja.contains("partial_samples"))
      EXPECT_EQ(ja.at("partial_samples").get<int64_t>(), jb.at("partial_samples").get<int64_t>()) << "step " << step;
  }
  ASSERT_FALSE(a.weights.empty());
  EXPECT_TRUE(a.weights == b.weights) << "the final weights differ from the uninterrupted run's";
}

std::filesystem::path fresh_root(const std::string& what) {
  const auto root = std::filesystem::temp_directory_path() / ("atoll_rl_pdis_" + what + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  return root;
}

// The rank dies kKill tokens into its journals: past RL step 0's two batches (~313 tokens here),
// mid-round in trainer 0's batch of RL step 1, which holds rollouts carried from step 0 (asserted
// below, so a change in the token counts shows up as a failed precondition, not a weaker test).
constexpr int64_t kKill = 345;

void shadow_takeover(int staleness) {
  const auto root = fresh_root("shadow" + std::to_string(staleness));
  const JobRun a = launch(root, "a", {}, 4, 8, staleness),
               b = launch(root, "b", {"--fault.rl_kill_after_tokens=" + std::to_string(kKill)}, 4, 8, staleness);
  ASSERT_EQ(a.rc, 0) << a.out;
  EXPECT_EQ(a.out.find("takes over"), std::string::npos) << a.out;
  ASSERT_EQ(b.rc, 0) << "the job did not outlive its rollout rank: " << b.out;
  EXPECT_NE(b.out.find("rank 2 (pid"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("the job goes on without it"), std::string::npos) << b.out;
  const std::string said = "shadow rank 3 takes over rollout rank 2 for trainer 0 at RL step ";
  const size_t at = b.out.find(said);
  ASSERT_NE(at, std::string::npos) << b.out;
  const int64_t step = std::stoll(b.out.substr(at + said.size()));
  ASSERT_GE(step, 1) << "the rank died before any rollout was carried: " << b.out;
  // On policy step 1 is generated with version 4; one step off, with version 3 (kept by the shadow).
  EXPECT_NE(b.out.find(said + "1 (version " + std::to_string(4 - staleness) + ")"), std::string::npos) << b.out;
  // On policy the step the shadow took over trains rollouts begun under an older version
  // (trainer 0's metrics); one step off steps 0 and 1 share version 3, so rollouts carried through
  // the shadow's adopted pool show two versions from step 2 on.
  ASSERT_TRUE(a.rl.count(4 + step + staleness)) << a.out;
  ASSERT_GT(a.rl.at(4 + step + staleness).at("partial_samples").get<int64_t>(), 0)
      << "no rollout carried across an update through the taken-over stream";
  EXPECT_NE(b.out.find("continued over a journal"), std::string::npos) << "the dead rank's lines were not continued";
  ASSERT_EQ(b.rl.size(), 5u) << "the job did not run to its end: " << b.out;
  expect_equal_steps(a, b, 0);
  EXPECT_GE(b.rl.rbegin()->second.at("from_shadow").get<int64_t>(), 1);
  std::filesystem::remove_all(root);
}

// On policy: the rank dies mid-round of trainer 0's RL step 1 batch (version 4).
TEST(RlPartialDisaggregated, ShadowTakesOverARolloutRankHoldingCarriedRollouts) { shadow_takeover(0); }

// One step off: the same token count falls while the rank pre-generates step 1 with version 3
// (the trainers are at version 4): the shadow continues it with the version-3 weights it kept.
TEST(RlPartialDisaggregated, ShadowTakesOverARolloutRankHoldingCarriedRolloutsOneStepOff) { shadow_takeover(1); }

TEST(RlPartialDisaggregated, TrainerDeathStopsTheJobNamingItAndTheResumeContinuesTheSameRollouts) {
  const auto root = fresh_root("trainer");
  const JobRun a = launch(root, "a", {});
  ASSERT_EQ(a.rc, 0) << a.out;
  // Trainer 1 dies asking for step 7's batch; the checkpoint of step 4 holds every trainer's pool.
  const JobRun b = launch(root, "b", {"--fault.rl_kill_trainer=1", "--fault.rl_kill_trainer_step=7"});
  EXPECT_NE(b.rc, 0) << b.out;
  EXPECT_LT(b.seconds, 60) << "the job took long to stop after its trainer died: " << b.out;
  EXPECT_NE(b.out.find("rank 1 (pid"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("the job cannot go on without it"), std::string::npos) << b.out;
  EXPECT_EQ(b.out.find("the job goes on without it"), std::string::npos) << "--outlive spent on a trainer: " << b.out;
  EXPECT_FALSE(b.rl.count(7)) << "step 7 ran without trainer 1";
  ASSERT_TRUE(std::filesystem::exists(root / "b/checkpoints/step_00000004")) << b.out;
  // The resumed run's first RL steps hold rollouts carried from before the checkpoint.
  ASSERT_GT(a.rl.at(5).at("partial_samples").get<int64_t>(), 0) << "no carried rollout across the checkpoint";
  const JobRun c = launch(root, "b", {"--resume", "--run.overwrite=false"});
  ASSERT_EQ(c.rc, 0) << c.out;
  expect_equal_steps(a, c, 5);
  std::filesystem::remove_all(root);
}

// Without a shadow (3 ranks, no journal): the pools travel with the batches and the first push.
TEST(RlPartialDisaggregated, ResumeContinuesTheCarriedRolloutsWithoutAShadow) {
  const auto root = fresh_root("plain");
  const JobRun a = launch(root, "a", {}, 3);
  ASSERT_EQ(a.rc, 0) << a.out;
  const JobRun b = launch(root, "b", {}, 3, 5);
  ASSERT_EQ(b.rc, 0) << b.out;
  const JobRun c = launch(root, "b", {"--resume", "--run.overwrite=false"}, 3);
  ASSERT_EQ(c.rc, 0) << c.out;
  ASSERT_GT(a.rl.at(6).at("partial_samples").get<int64_t>(), 0) << "no carried rollout across the checkpoint";
  expect_equal_steps(a, c, 6);
  std::filesystem::remove_all(root);
}

// One step off (rl.max_staleness 1) the rollout rank generates step k+1 with version k while the
// trainers train step k, so a checkpoint taken after step k stands on a batch that exists only on
// the rollout rank. The checkpoint keeps the last push's weights (task.rl.behind.*), and the resumed
// run pushes them first (PushHeader::ahead): the rollout rank pre-generates step k+1 with version k
// as the saving run did. Before, it generated it with version k+1 and the resumed run diverged at
// its first step. With partial rollouts (the pools from the checkpoint travel with that first push)
// and without; the with-partial run also has the shadow following the ahead push.
void resume_one_step_off(const std::string& what, const std::vector<std::string>& extra, int ranks) {
  const auto root = fresh_root("off_" + what);
  const JobRun a = launch(root, "a", extra, ranks, 8, 1);
  ASSERT_EQ(a.rc, 0) << a.out;
  const JobRun b = launch(root, "b", extra, ranks, 5, 1);
  ASSERT_EQ(b.rc, 0) << b.out;
  std::vector<std::string> resume = extra;
  resume.insert(resume.end(), {"--resume", "--run.overwrite=false"});
  const JobRun c = launch(root, "b", resume, ranks, 8, 1);
  ASSERT_EQ(c.rc, 0) << c.out;
  for (int64_t step = 6; step <= 8; ++step)  // from the last checkpoint (step 5)
    ASSERT_TRUE(c.rl.count(step)) << "step " << step << ": " << c.out;
  // Step 6's batch was generated one version behind the trainers (with partial rollouts its oldest
  // tokens older still): what the ahead push restores.
  EXPECT_GE(c.rl.at(6).at("staleness").get<int64_t>(), 1);
  EXPECT_EQ(c.rl.at(6).at("staleness").get<int64_t>(), a.rl.at(6).at("staleness").get<int64_t>());
  EXPECT_EQ(c.rl.at(6).at("rollout_version").get<int64_t>(), a.rl.at(6).at("rollout_version").get<int64_t>());
  expect_equal_steps(a, c, 6);
  std::filesystem::remove_all(root);
}

TEST(RlPartialDisaggregated, ResumeOneStepOffIsBitExact) { resume_one_step_off("plain", {"--rl.partial_tokens=0"}, 3); }

TEST(RlPartialDisaggregated, ResumeOneStepOffIsBitExactWithCarriedRolloutsAndAShadow) {
  resume_one_step_off("partial", {}, 4);
}

}  // namespace
}  // namespace atl::rl
