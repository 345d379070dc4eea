// The colocated placement on 2 ranks through `atoll launch` (DDP): both ranks generate, the job's
// reward is reported, and the first RL step's KL is exactly 0 on the trainer's side of each rank
// (rank 0's is logged; a rank whose weights or batch differed would diverge at the all-reduce of
// the next steps' losses, which the finite loss and equal step count also cover).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
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
    if (j.contains("heldout_acc")) EXPECT_GE(j.at("heldout_acc").get<double>(), 0.0);
  }
  EXPECT_EQ(rl_steps, 5);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace atl
