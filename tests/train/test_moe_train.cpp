// The MoE family (src/models/moe) through the trainer: it learns, reports its balance and z losses
// in metrics.jsonl, resumes bit-exactly from its checkpoint (weights under the names docs/moe.md
// states), and bad layouts are refused before the first step naming the key and its line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "models/moe/moe_model.h"
#include "nn/model.h"
#include "tensor/rng.h"
#include "train/metrics.h"
#include "trainer_fixture.h"

using namespace atl;
using namespace atl::test;

namespace {

Config moe_config(const fs::path& root, const std::string& data, int64_t steps, const std::string& extra = "") {
  std::string t = tiny_config_text(root, data, steps);
  const std::string from = "preset = \"gpt2-tiny\"";
  t.replace(t.find(from), from.size(), "family = \"moe\"\npreset = \"moe-tiny\"\n" + extra);
  return Config::parse(t, "moe.toml");
}

}  // namespace

TEST(MoETrain, LearnsAndReportsItsAuxiliaryLosses) {
  fs::path a = scratch("moe_learn");
  std::string data = make_data(a);
  Config c = moe_config(a, data, 30);
  Trainer t(c);
  EXPECT_EQ(t.model().family(), "moe");
  auto r = t.run(false);
  EXPECT_LT(r.final_val_loss, 0.75 * std::log(257.0)) << "the MoE model did not learn";
  auto recs = read_metrics((a / "run" / "metrics.jsonl").string());
  ASSERT_EQ(recs.size(), 30u);
  for (const auto& rec : recs) {
    ASSERT_TRUE(rec.contains("moe_balance_loss")) << rec.dump();
    // E/(kN) sum_e count_e mean p_e is 1 for perfectly even routing and at most E (all to one).
    const double b = rec["moe_balance_loss"];
    EXPECT_GT(b, 0.5);
    EXPECT_LT(b, 8.0);
    EXPECT_TRUE(std::isfinite(double(rec["moe_z_loss"])));
    EXPECT_EQ(double(rec["moe_dropped"]), 0.0) << "no-drop mode dropped tokens";
  }
  // The stated safetensors names (docs/moe.md).
  bool experts = false, gate = false, shared = false, dense = false;
  for (auto& [n, v] : t.model().state_dict()) {
    experts |= n == "model.layers.1.mlp.experts.gate_up_proj";
    gate |= n == "model.layers.1.mlp.gate.weight";
    shared |= n == "model.layers.2.mlp.shared_experts.down_proj.weight";
    dense |= n == "model.layers.0.mlp.gate_up_proj.weight";
  }
  EXPECT_TRUE(experts && gate && shared && dense);
  fs::remove_all(a);
}

TEST(MoETrain, DropModeResumesBitExactly) {
  fs::path a = scratch("moe_resume_a"), b = scratch("moe_resume_b");
  std::string data = make_data(a);
  const std::string drop = "drop_tokens = true\ncapacity_factor = 1.0\nrouter_score = \"sigmoid\"\n";
  std::vector<float> straight, resumed;
  double dropped = 0;
  {
    Config c = moe_config(a, data, 8, drop);
    Trainer t(c);
    t.run(false);
    straight = weights_of(t);
    dropped = read_metrics((a / "run" / "metrics.jsonl").string()).back()["moe_dropped"];
  }
  EXPECT_GT(dropped, 0.0) << "capacity factor 1 dropped nothing: the case tests no dropping";
  {
    Config c = moe_config(b, data, 8, drop);
    c.set_override("train.stop_after=4");
    Trainer t(c);
    EXPECT_EQ(t.run(false).final_step, 4);
  }
  {
    Config c = moe_config(b, data, 8, drop);
    Trainer t(c);
    EXPECT_EQ(t.run(true).final_step, 8);
    resumed = weights_of(t);
  }
  ASSERT_EQ(straight.size(), resumed.size());
  EXPECT_EQ(std::memcmp(straight.data(), resumed.data(), straight.size() * sizeof(float)), 0);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(MoETrain, BadLayoutsAreRefusedBeforeTheFirstStep) {
  fs::path a = scratch("moe_bad");
  const std::string data = (a / "nodata").string();  // never read: the config fails first
  struct Bad {
    std::string extra, says;
  } bad[] = {{"top_k = 9\n", "model.top_k = 9 (moe.toml:"},
             {"capacity_factor = 0.0\n", "model.capacity_factor = 0 (moe.toml:"},
             {"capacity_factor = -1.0\n", "model.capacity_factor = -1 (moe.toml:"}};
  for (const Bad& b : bad) {
    Config c = moe_config(a, data, 4, b.extra);
    try {
      Trainer t(c);
      ADD_FAILURE() << "accepted " << b.extra;
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), b.says)) << e.what();
    }
  }
  fs::remove_all(a);
}

// [train] recompute on the MoE family: "selective" recomputes each block's attention core (it
// used to be accepted and ignored), "full" each block; the forward is rerun by the same kernels
// on the same inputs, so the loss and every gradient are bit-identical to keeping everything.
TEST(MoETrain, RecomputePoliciesAreAppliedAndBitIdentical) {
  nn::MoEModelConfig c = nn::MoEModelConfig::preset("moe-tiny");
  Rng rng(11, 0);
  std::vector<int32_t> tok(2 * 16), tgt(2 * 16);
  for (auto& t : tok) t = int32_t(rng.below(uint64_t(c.attn.vocab_size)));
  for (auto& t : tgt) t = int32_t(rng.below(uint64_t(c.attn.vocab_size)));
  const Tensor x = Tensor::from_vector_i32(tok, {2, 16}), y = Tensor::from_vector_i32(tgt, {2, 16});
  auto run = [&](Recompute r, double* loss) {
    nn::MoEModel m(c);
    m.init_weights(5);
    m.set_recompute(std::vector<Recompute>(m.layers.size(), r));
    for (auto* b : m.layers) EXPECT_EQ(b->self_attn->recompute_core, r == Recompute::selective);
    m.zero_grad();
    Tensor l = m.loss(x, y);
    *loss = l.item();
    backward(l);
    return m.flat_grads().clone();
  };
  double l0 = 0, l1 = 0, l2 = 0;
  Tensor g0 = run(Recompute::none, &l0), g1 = run(Recompute::selective, &l1),
         g2 = run(Recompute::full, &l2);
  EXPECT_EQ(l0, l1);
  EXPECT_EQ(l0, l2);
  ASSERT_EQ(g0.numel(), g1.numel());
  EXPECT_EQ(std::memcmp(g0.f32(), g1.f32(), size_t(g0.numel()) * 4), 0) << max_abs_diff(g0, g1);
  EXPECT_EQ(std::memcmp(g0.f32(), g2.f32(), size_t(g0.numel()) * 4), 0) << max_abs_diff(g0, g2);
  EXPECT_GT(max_abs_diff(g0, Tensor::zeros(g0.shape())), 0.0);
}
