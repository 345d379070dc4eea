// Belayer's live takeover (rl.shadow_ranks = 1, rl/shadow_rank.cpp): a disaggregated job of 4 ranks
// (trainers 0-1, rollout rank 2, shadow rank 3) under `atoll launch --outlive 1`. The rollout rank
// SIGKILLs itself mid-trajectory (fault.rl_kill_after_tokens); the job is not restarted: the
// trainers find it dead, the shadow continues its journal and serves its trainers to the end.
//
// The result is compared for EQUALITY with the same job without the fault, not against a bound:
// a journaled batch is a function of its stream, step, version and weights only (each rollout
// decodes alone from its own Rng, rl/belayer.h), the shadow holds the pushed weights bit for bit
// (the trainers check a hash of them), and it continues the dead rank's own file, re-sampling and
// checking every logged token. So every RL step's loss and the final weights are bitwise the
// uninterrupted run's; both runs are one binary on one machine with one thread per rank.
#include <gtest/gtest.h>

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
  std::string out;
  std::map<int64_t, nlohmann::json> rl;  // RL step records by trainer step
  std::string weights;                   // the final checkpoint's model.safetensors
};

// rollout_ranks 2: 5 ranks (trainers 0-1, rollout ranks 2-3, shadow 4). `--outlive` covers every
// rollout rank and the shadow (the ranks the job declares it can lose).
JobRun launch(const std::filesystem::path& root, const std::string& name, int staleness, int64_t kill_after,
           int rollout_ranks = 1, const std::vector<std::string>& extra = {}) {
  const std::string atoll = std::string(ATOLL_BINARY_DIR) + "/atoll";
  const std::string cfg = std::string(ATOLL_SOURCE_DIR) + "/configs/rl_add.toml";
  std::vector<std::string> argv = {atoll, "launch", "--nproc-per-node", std::to_string(3 + rollout_ranks), "--outlive",
                                   std::to_string(rollout_ranks + 1), "--timeout", "60", "--",
                                   atoll, "train", cfg, "--run.dir=" + (root / name).string(), "--train.steps=8",
                                   "--rl.sft_steps=3", "--rl.prompts=4", "--rl.group_size=4", "--eval.every=0",
                                   "--sample.every=0", "--hardware.peak_gflops=1", "--rl.placement=disaggregated",
                                   "--rl.rollout_ranks=" + std::to_string(rollout_ranks), "--rl.shadow_ranks=1",
                                   "--checkpoint.every=8", "--rl.max_staleness=" + std::to_string(staleness),
                                   "--rl.journal_dir=" + (root / (name + "_journal")).string()};
  if (kill_after > 0) argv.push_back("--fault.rl_kill_after_tokens=" + std::to_string(kill_after));
  argv.insert(argv.end(), extra.begin(), extra.end());
  JobRun r;
  const std::string log = (root / (name + ".log")).string();
  r.rc = parallel::test::run_command(argv, {"OMP_NUM_THREADS=1"}, log, 180);
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

void takeover(int staleness, int64_t kill_after, const std::string& expect_takeover) {
  const auto root = std::filesystem::temp_directory_path() /
                    ("atoll_rl_shadow_" + std::to_string(staleness) + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const JobRun a = launch(root, "a", staleness, 0), b = launch(root, "b", staleness, kill_after);
  ASSERT_EQ(a.rc, 0) << a.out;
  EXPECT_EQ(a.out.find("takes over"), std::string::npos) << "no rank died, yet the shadow took over: " << a.out;
  ASSERT_EQ(b.rc, 0) << "the job did not outlive its rollout rank: " << b.out;
  EXPECT_NE(b.out.find("rank 2 (pid"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("the job goes on without it"), std::string::npos) << b.out;
  EXPECT_EQ(b.out.find("starting it again"), std::string::npos) << "a restart, not a takeover: " << b.out;
  // The cut rollout continued from its logged prefix, inside the running job.
  EXPECT_NE(b.out.find("shadow rank 3 takes over rollout rank 2 for trainer 0 at RL step " + expect_takeover),
            std::string::npos)
      << b.out;
  EXPECT_NE(b.out.find(", 1 continued from their prefix"), std::string::npos) << b.out;
  ASSERT_EQ(a.rl.size(), 5u) << a.out;
  ASSERT_EQ(b.rl.size(), 5u) << "the job did not run to its end: " << b.out;
  for (const auto& [step, ja] : a.rl) {
    ASSERT_TRUE(b.rl.count(step)) << "step " << step;
    const nlohmann::json& jb = b.rl.at(step);
    EXPECT_EQ(ja.at("loss").get<double>(), jb.at("loss").get<double>()) << "step " << step;
    EXPECT_EQ(ja.at("reward").get<double>(), jb.at("reward").get<double>()) << "step " << step;
    EXPECT_EQ(ja.at("rollout_version").get<int64_t>(), jb.at("rollout_version").get<int64_t>()) << "step " << step;
    EXPECT_EQ(ja.at("from_shadow").get<int64_t>(), 0) << "step " << step;
  }
  // Trainer 0's last batches all came from the shadow (the first one it asked for included).
  EXPECT_GE(b.rl.rbegin()->second.at("from_shadow").get<int64_t>(), 4);
  ASSERT_FALSE(a.weights.empty());
  EXPECT_TRUE(a.weights == b.weights) << "the final weights differ from the uninterrupted run's";
  std::filesystem::remove_all(root);
}

// On policy: the rank dies after 20 of the first RL step's tokens (trainer 0's batch, mid-rollout).
TEST(RlShadowRank, TakesOverAKilledRolloutRankOnPolicy) { takeover(0, 20, "0 (version 3)"); }

// One step off: a batch holds at most 16 rollouts x 4 sampled tokens (2-digit sums, max_new 4),
// so after 138 tokens the rank has sent step 0's two batches and dies pre-generating step 1's
// with version 3 while the trainers train; the shadow, already at version 4, continues that
// journal with the version-3 weights it kept.
TEST(RlShadowRank, TakesOverAKilledRolloutRankOneStepOff) { takeover(1, 138, "1 (version 3)"); }

std::filesystem::path fresh_root(const std::string& what) {
  const auto root = std::filesystem::temp_directory_path() / ("atoll_rl_shadow_" + what + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  return root;
}

void expect_equal_runs(const JobRun& a, const JobRun& b) {
  ASSERT_EQ(a.rl.size(), 5u) << a.out;
  ASSERT_EQ(b.rl.size(), 5u) << "the job did not run to its end: " << b.out;
  for (const auto& [step, ja] : a.rl) {
    ASSERT_TRUE(b.rl.count(step)) << "step " << step;
    const nlohmann::json& jb = b.rl.at(step);
    EXPECT_EQ(ja.at("loss").get<double>(), jb.at("loss").get<double>()) << "step " << step;
    EXPECT_EQ(ja.at("reward").get<double>(), jb.at("reward").get<double>()) << "step " << step;
    EXPECT_EQ(ja.at("rollout_version").get<int64_t>(), jb.at("rollout_version").get<int64_t>()) << "step " << step;
  }
  ASSERT_FALSE(a.weights.empty());
  EXPECT_TRUE(a.weights == b.weights) << "the final weights differ from the uninterrupted run's";
}

// Two rollout ranks, one shadow: rollout rank 2 (trainer 0's) dies 20 tokens into RL step 0,
// rollout rank 3 (trainer 1's) 150 tokens later (fault.rl_kill_stagger), during RL step 2 (its
// batches are <= 64 tokens: 16 rollouts x 4). The shadow, already serving trainer 0, has followed
// rank 3's journals all along; trainer 1 asks it in turn and it continues rank 3's journal too, so
// the shadow ends serving both trainers and the run is the uninterrupted one's bit for bit.
TEST(RlShadowRank, OutlivesASecondRolloutRanksDeath) {
  const auto root = fresh_root("second");
  const JobRun a = launch(root, "a", 0, 0, 2);
  ASSERT_EQ(a.rc, 0) << a.out;
  const JobRun b = launch(root, "b", 0, 20, 2, {"--fault.rl_kill_stagger=150"});
  ASSERT_EQ(b.rc, 0) << "the job did not outlive its two rollout ranks: " << b.out;
  EXPECT_NE(b.out.find("rank 2 (pid"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("rank 3 (pid"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("shadow rank 4 takes over rollout rank 2 for trainer 0 at RL step 0"), std::string::npos)
      << b.out;
  const std::string second = "shadow rank 4 takes over rollout rank 3 for trainer 1 at RL step ";
  const size_t at = b.out.find(second);
  ASSERT_NE(at, std::string::npos) << b.out;
  EXPECT_GE(std::stoll(b.out.substr(at + second.size())), 1) << "the two deaths were not one after the other";
  expect_equal_runs(a, b);
  // Trainer 0's last batches all came from the shadow (it asked at RL step 0).
  EXPECT_GE(b.rl.rbegin()->second.at("from_shadow").get<int64_t>(), 4);
  std::filesystem::remove_all(root);
}

// The shadow's own death (fault.rl_kill_shadow_step: it SIGKILLs itself after RL step 1's push):
// trainer 0 finds it gone at the next push, leaves it out, and the rollout rank serves to the end
// (the run equals the no-fault one). A rollout rank dying after that has no spare left: its
// trainers generate their own batches (RlEngine::self_generate), continuing the dead rank's
// journal, so that run equals the no-fault one too.
TEST(RlShadowRank, OutlivesTheShadowsDeathAndThenTheRolloutRanks) {
  const auto root = fresh_root("shadowdeath");
  const JobRun a = launch(root, "a", 0, 0);
  ASSERT_EQ(a.rc, 0) << a.out;
  const JobRun b = launch(root, "b", 0, 0, 1, {"--fault.rl_kill_shadow_step=1"});
  ASSERT_EQ(b.rc, 0) << "the job did not outlive its shadow: " << b.out;
  EXPECT_NE(b.out.find("rank 3 (pid"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("the shadow rank 3 is gone"), std::string::npos) << b.out;
  EXPECT_EQ(b.out.find("takes over"), std::string::npos) << b.out;
  EXPECT_EQ(b.out.find("generates its own batches"), std::string::npos) << b.out;
  expect_equal_runs(a, b);
  // The rollout rank dies in RL step 3, after the shadow (launch --outlive 2 for both).
  const JobRun c = launch(root, "c", 0, 200, 1, {"--fault.rl_kill_shadow_step=1"});
  ASSERT_EQ(c.rc, 0) << "the job did not outlive its shadow and then its rollout rank: " << c.out;
  EXPECT_NE(c.out.find("rank 2 (pid"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("trainer 0 generates its own batches from RL step "), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("trainer 1 generates its own batches from RL step "), std::string::npos) << c.out;
  expect_equal_runs(a, c);
  EXPECT_GE(c.rl.rbegin()->second.at("self_generated").get<int64_t>(), 1);
  EXPECT_EQ(a.rl.rbegin()->second.at("self_generated").get<int64_t>(), 0);
  std::filesystem::remove_all(root);
}

// The shadow dies after it took over: the rollout rank dies mid-rollout (as in the takeover tests
// above), the shadow serves its trainers, then SIGKILLs itself after RL step 3's push, before it
// sends that step's batch. The trainers ask it, find it dead and generate their own batches from
// step 3 on, continuing the shadow's journal (one step off: step 3's batch is the one the shadow
// had pre-generated with version 5's weights, which each trainer kept). Equal to the no-fault run.
void shadow_dies_after_takeover(int staleness, int64_t kill_after, const std::string& first_own) {
  const auto root = fresh_root("afterover" + std::to_string(staleness));
  const JobRun a = launch(root, "a", staleness, 0);
  ASSERT_EQ(a.rc, 0) << a.out;
  const JobRun b = launch(root, "b", staleness, kill_after, 1, {"--fault.rl_kill_shadow_step=3"});
  ASSERT_EQ(b.rc, 0) << "the job did not outlive its rollout rank and then its shadow: " << b.out;
  EXPECT_NE(b.out.find("rank 2 (pid"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("rank 3 (pid"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("shadow rank 3 takes over rollout rank 2 for trainer 0"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("trainer 0 generates its own batches from RL step 3"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("trainer 0 generated its own batch of RL step 3 (version " + first_own), std::string::npos)
      << b.out;
  expect_equal_runs(a, b);
  EXPECT_EQ(b.rl.rbegin()->second.at("self_generated").get<int64_t>(), 2);  // RL steps 3 and 4
  std::filesystem::remove_all(root);
}

TEST(RlShadowRank, TrainersGoOnWhenTheShadowDiesAfterTakingOverOnPolicy) { shadow_dies_after_takeover(0, 20, "6)"); }
TEST(RlShadowRank, TrainersGoOnWhenTheShadowDiesAfterTakingOverOneStepOff) {
  shadow_dies_after_takeover(1, 138, "5)");
}

}  // namespace
}  // namespace atl::rl
