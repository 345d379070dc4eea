// The colocated placement on 2 ranks through `atoll launch` (DDP): both ranks generate, the job's
// reward is reported, and the first RL step's KL is exactly 0 on the trainer's side of each rank
// (rank 0's is logged; a rank whose weights or batch differed would diverge at the all-reduce of
// the next steps' losses, which the finite loss and equal step count also cover).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "parallel/harness.h"

namespace atl {
namespace {

TEST(RlLaunch, ColocatedOnTwoRanks) {
  const auto root = std::filesystem::temp_directory_path() / ("atoll_rl_launch_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::string atoll = std::string(ATOLL_BINARY_DIR) + "/atoll";
  const std::string cfg = std::string(ATOLL_SOURCE_DIR) + "/configs/rl_add.toml";
  std::vector<std::string> argv = {atoll, "launch", "--nproc-per-node", "2", "--timeout", "30", "--", atoll, "train",
                                   cfg, "--run.dir=" + (root / "run").string(), "--train.steps=8", "--rl.sft_steps=3",
                                   "--rl.prompts=4", "--rl.group_size=4", "--eval.every=8", "--rl.eval_size=20",
                                   "--sample.every=0", "--hardware.peak_gflops=1"};
  const std::string log = (root / "log").string();
  const int rc = parallel::test::run_command(argv, {"OMP_NUM_THREADS=1"}, log, 120);
  const std::string out = parallel::test::read_file(log);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("over 2 ranks"), std::string::npos) << out;
  std::ifstream f(root / "run" / "metrics.jsonl");
  int rl_steps = 0;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") != "rl") continue;
    ++rl_steps;
    if (j.at("rl_step").get<int64_t>() == 1) {
      EXPECT_EQ(j.at("kl").get<double>(), 0.0) << line;
      EXPECT_EQ(j.at("ratio").get<double>(), 1.0) << line;
    }
    EXPECT_TRUE(std::isfinite(j.at("loss").get<double>())) << line;
    EXPECT_GE(j.at("reward").get<double>(), 0.0);
    if (j.contains("heldout_acc")) {
      EXPECT_GE(j.at("heldout_acc").get<double>(), 0.0);
    }
  }
  EXPECT_EQ(rl_steps, 5);
  std::filesystem::remove_all(root);
}

// Carried partial groups on 2 ranks (rl.partial_tokens = 1): each rank's pool is its own, so the
// checkpoint (written by rank 0) must hold rank 1's too. 6 steps, then --resume to 10, against 10
// straight: every resumed step's job loss equal and the final weights' file byte for byte. Were
// rank 1's pool lost, its step-7 batch would be drawn anew and the job's loss would differ.
TEST(RlLaunch, PartialGroupsOfEveryRankSurviveAResume) {
  const auto root = std::filesystem::temp_directory_path() / ("atoll_rl_launch_partial_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root);
  const std::string atoll = std::string(ATOLL_BINARY_DIR) + "/atoll";
  const std::string cfg = std::string(ATOLL_SOURCE_DIR) + "/configs/rl_add.toml";
  auto launch = [&](const std::string& dir, int steps, bool resume) {
    std::vector<std::string> argv = {atoll, "launch", "--nproc-per-node", "2", "--timeout", "30", "--", atoll, "train",
                                     cfg, "--run.dir=" + (root / dir).string(), "--train.steps=" + std::to_string(steps),
                                     "--rl.sft_steps=3", "--rl.prompts=4", "--rl.group_size=4", "--rl.partial_tokens=1",
                                     "--rl.kl_coef=0.1", "--rl.lr_scale=1", "--model.n_embd=32", "--eval.every=0",
                                     "--sample.every=0", "--hardware.peak_gflops=1"};
    if (resume) argv.insert(argv.end(), {"--resume", "--run.overwrite=false"});
    const std::string log = (root / (dir + std::to_string(steps) + ".log")).string();
    const int rc = parallel::test::run_command(argv, {"OMP_NUM_THREADS=1"}, log, 120);
    ASSERT_EQ(rc, 0) << parallel::test::read_file(log);
  };
  launch("a", 10, false);
  launch("b", 6, false);
  launch("b", 10, true);
  auto losses = [&](const std::string& dir) {
    std::map<int64_t, double> m;
    std::ifstream f(root / dir / "metrics.jsonl");
    for (std::string line; std::getline(f, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.value("phase", "") == "rl") m[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
    }
    return m;
  };
  auto a = losses("a"), b = losses("b");
  for (int64_t s = 7; s <= 10; ++s) {
    ASSERT_TRUE(a.count(s) && b.count(s)) << "step " << s;
    EXPECT_EQ(a[s], b[s]) << "step " << s << " loss";
  }
  const std::string wa = parallel::test::read_file((root / "a/checkpoints/step_00000010/model.safetensors").string());
  const std::string wb = parallel::test::read_file((root / "b/checkpoints/step_00000010/model.safetensors").string());
  EXPECT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "the resumed run's final weights differ";
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace atl
