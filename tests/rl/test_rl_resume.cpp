// Resuming an RL run is bit-exact with the KL to the frozen reference on: the reference (taken
// when RL starts, after the SFT warm start) is in the checkpoint (with the async rollout copy and
// PPO's value head), so a run stopped after step 6 and resumed to step 10 ends with every parameter
// bit equal to an uninterrupted 10-step run's, and every resumed step's loss and KL equal. Were the
// reference re-taken from the resumed policy, the KL of step 7 would drop to 0 and the weights
// would differ (the KL term is in the loss: kl_coef 0.1). With partial rollouts, the groups carried
// across the stop are in the checkpoint too.
#include <gtest/gtest.h>

#include "tiny_model.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "train/trainer.h"

namespace atl {
namespace {

std::string config(const std::filesystem::path& dir, int steps, const std::string& rl_extra) {
  return R"(
[run]
dir = ")" + dir.string() + R"(")" + rl::rltest::kTinyModel + R"(
[train]
task = "rl"
steps = )" + std::to_string(steps) + R"(
batch_size = 16
seq_len = 16
warmup_steps = 2
schedule = "constant"
seed = 3
threads = 1
[optim.adamw]
lr = 3e-3
weight_decay = 0.0
[rl]
task = "add"
sft_steps = 3
sft_batch = 32
prompts = 4
group_size = 4
kl_coef = 0.1
lr_scale = 1.0
eval_size = 10
)" + rl_extra + R"(
[eval]
every = 0
[sample]
every = 0
[log]
every = 100
[checkpoint]
every = 0
[hardware]
peak_gflops = 1
)";
}

std::vector<float> run(const std::filesystem::path& dir, int steps, bool resume, const std::string& extra) {
  Config cfg = Config::parse(config(dir, steps, extra), "resume.toml");
  Trainer t(cfg);
  TrainResult r = t.run(resume);
  EXPECT_EQ(r.final_step, steps);
  Tensor v = t.model().flat_values();
  return std::vector<float>(v.f32(), v.f32() + v.numel());
}

// step -> (loss, kl) of the RL steps in the run dir's last segment
std::map<int64_t, std::pair<double, double>> rl_steps(const std::filesystem::path& dir) {
  std::map<int64_t, std::pair<double, double>> m;
  std::ifstream f(dir / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") == "rl") m[j.at("step").get<int64_t>()] = {j.at("loss").get<double>(), j.at("kl").get<double>()};
  }
  return m;
}

void expect_bit_exact_resume(const std::string& extra) {
  const auto root = std::filesystem::temp_directory_path() / ("atoll_rl_resume_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  const std::vector<float> straight = run(root / "a", 10, false, extra);
  run(root / "b", 6, false, extra);
  const std::vector<float> resumed = run(root / "b", 10, true, extra);
  ASSERT_EQ(straight.size(), resumed.size());
  size_t differ = 0;
  for (size_t i = 0; i < straight.size(); ++i) differ += std::memcmp(&straight[i], &resumed[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << extra << ": " << differ << " of " << straight.size() << " parameters differ after the resume";
  auto a = rl_steps(root / "a"), b = rl_steps(root / "b");
  for (int64_t s = 7; s <= 10; ++s) {
    ASSERT_TRUE(a.count(s) && b.count(s)) << s;
    EXPECT_EQ(a[s].first, b[s].first) << extra << " step " << s << " loss";
    EXPECT_EQ(a[s].second, b[s].second) << extra << " step " << s << " kl";
  }
  EXPECT_GT(a[7].second, 0.0) << "the KL must be on for the test to mean anything";
  std::filesystem::remove_all(root);
}

TEST(RlResume, BitExactWithTheReferenceColocated) { expect_bit_exact_resume(""); }
TEST(RlResume, BitExactWithTheReferenceAsync) { expect_bit_exact_resume("placement = \"async\"\n"); }
TEST(RlResume, BitExactWithTheValueHeadPpo) { expect_bit_exact_resume("algorithm = \"ppo\"\n"); }

// Partial rollouts (rl.partial_tokens = 1: completions of up to 4 tokens take up to 4 rounds, so
// groups are carried across updates): the groups carried past the checkpoint at step 6 (every
// token, its version and behaviour log-prob bit) are in it, so the resumed run trains on the same
// batches. Were the pool lost at the stop, step 7's batch would be drawn anew: other losses and
// weights. The staleness check makes sure step 7 did train on tokens sampled before the stop.
TEST(RlResume, BitExactWithCarriedPartialGroups) {
  const std::string extra = "partial_tokens = 1\n";
  expect_bit_exact_resume(extra);
  const auto dir = std::filesystem::temp_directory_path() / ("atoll_rl_resume_partial_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  run(dir, 7, false, extra);
  std::ifstream f(dir / "metrics.jsonl");
  int64_t staleness = -1;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("step", int64_t(-1)) == 7) staleness = j.at("staleness").get<int64_t>();
  }
  EXPECT_GT(staleness, 0) << "step 7's batch holds no token sampled before step 6's checkpoint: the test means nothing";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atl
