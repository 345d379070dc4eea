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

struct Run {
  int rc = -1;
  std::string out;
  std::map<int64_t, nlohmann::json> rl;  // RL step records by trainer step
  std::string weights;                   // the final checkpoint's model.safetensors
};

Run launch(const std::filesystem::path& root, const std::string& name, int staleness, int64_t kill_after) {
  const std::string atoll = std::string(ATOLL_BINARY_DIR) + "/atoll";
  const std::string cfg = std::string(ATOLL_SOURCE_DIR) + "/configs/rl_add.toml";
  std::vector<std::string> argv = {atoll, "launch", "--nproc-per-node", "4", "--outlive", "1", "--timeout", "60", "--",
                                   atoll, "train", cfg, "--run.dir=" + (root / name).string(), "--train.steps=8",
                                   "--rl.sft_steps=3", "--rl.prompts=4", "--rl.group_size=4", "--eval.every=0",
                                   "--sample.every=0", "--hardware.peak_gflops=1", "--rl.placement=disaggregated",
                                   "--rl.rollout_ranks=1", "--rl.shadow_ranks=1", "--checkpoint.every=8",
                                   "--rl.max_staleness=" + std::to_string(staleness),
                                   "--rl.journal_dir=" + (root / (name + "_journal")).string()};
  if (kill_after > 0) argv.push_back("--fault.rl_kill_after_tokens=" + std::to_string(kill_after));
  Run r;
  const std::string log = (root / (name + ".log")).string();
  r.rc = parallel::test::run_command(argv, {"OMP_NUM_THREADS=1"}, log, 180);
  r.out = parallel::test::read_file(log);
  std::ifstream f(root / name / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") == "rl") r.rl[j.at("step").get<int64_t>()] = j;
  }
  r.weights = parallel::test::read_file((root / name / "checkpoints/step_00000008/model.safetensors").string());
  return r;
}

void takeover(int staleness, int64_t kill_after, const std::string& expect_takeover) {
  const auto root = std::filesystem::temp_directory_path() /
                    ("atoll_rl_shadow_" + std::to_string(staleness) + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const Run a = launch(root, "a", staleness, 0), b = launch(root, "b", staleness, kill_after);
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

}  // namespace
}  // namespace atl::rl
