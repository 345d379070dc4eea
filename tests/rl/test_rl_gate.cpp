// The short gate, through the trainer ([train] task = "rl") on 2-digit addition: after a 5-step
// SFT warm start the model almost never answers in the task's format (mean reward ~0.00-0.01:
// exact + 0.1 x format); 50 GRPO steps must raise the mean training reward of the last 5 steps
// above 0.06, i.e. a well-formed answer (digits, then the end marker) in at least 60% of the
// rollouts. It measures that the loop optimises the reward it is given (a wrong advantage sign,
// a lost gradient or rollouts scored against the wrong prompt leave it near 0); raising the
// exact-answer rate takes hundreds of steps and is the benchmark's job (bench/rl_grpo_add.sh).
// ~20 s on the loaded 2-core CI machine (one thread: a model this small is faster on one).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "train/trainer.h"

namespace atl {
namespace {

TEST(RlGate, GrpoRaisesTheMeanRewardWithin50Steps) {
  const auto dir = std::filesystem::temp_directory_path() / ("atoll_rl_gate_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  const std::string toml = R"(
[run]
dir = ")" + dir.string() + R"("
[model]
preset = "gpt2"
vocab_size = 128
block_size = 16
n_layer = 2
n_head = 4
n_embd = 64
[train]
task = "rl"
steps = 55
batch_size = 64
seq_len = 16
warmup_steps = 10
schedule = "constant"
seed = 1
threads = 1
[optim.adamw]
lr = 3e-3
weight_decay = 0.0
[rl]
task = "add"
digits = 2
algorithm = "grpo"
sft_steps = 5
sft_batch = 128
prompts = 16
group_size = 8
kl_coef = 0.02
lr_scale = 1.0
eval_size = 50
[eval]
every = 0
[sample]
every = 0
[log]
every = 100
[hardware]
peak_gflops = 1
)";
  Config cfg = Config::parse(toml, "gate.toml");
  TrainResult res = Trainer(cfg).run(false);
  EXPECT_EQ(res.final_step, 55);
  std::ifstream f(dir / "metrics.jsonl");
  std::vector<double> reward;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") == "rl") {
      reward.push_back(j.at("reward").get<double>());
      EXPECT_TRUE(j.contains("kl") && j.contains("gen_ms") && j.contains("train_ms") && j.contains("score_ms") &&
                  j.contains("sync_ms") && j.contains("entropy") && j.contains("gen_tokens_per_s"))
          << line;
    }
  }
  ASSERT_EQ(reward.size(), 50u);
  const double first = (reward[0] + reward[1] + reward[2] + reward[3] + reward[4]) / 5;
  const double last = (reward[45] + reward[46] + reward[47] + reward[48] + reward[49]) / 5;
  std::cout << "mean reward: first 5 RL steps " << first << ", last 5 " << last << "\n";
  EXPECT_LT(first, 0.03) << "the SFT start already answers in format; the gate would measure nothing";
  EXPECT_GT(last, 0.06) << "GRPO did not raise the mean reward within 50 steps (first 5 steps " << first << ")";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace atl
