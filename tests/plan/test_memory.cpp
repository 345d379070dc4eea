// Memory model: Korthikanti et al. 2022 Table 2 and Rajbhandari et al. 2020 (ZeRO).
#include <gtest/gtest.h>

#include "plan/memory_model.h"
#include "plan/predict.h"

using namespace atl::plan;

namespace {
// A GPT-3-style layer as in Korthikanti et al.: standard attention, dropout, ffn = 4h.
ModelSpec gpt(int64_t h, int64_t a, int64_t s) {
  ModelSpec m = model_preset("gpt2-124m");
  m.hidden = h, m.heads = m.kv_heads = a, m.ffn = 4 * h, m.seq = s;
  m.attention = "standard", m.dropout = true;
  return m;
}
}  // namespace

TEST(PlanMemory, ActivationsPerLayerMatchKorthikantiTable2) {
  for (auto [h, a, s, b, t] : {std::tuple{12288, 96, 2048, 1, 8}, std::tuple{6144, 64, 2048, 4, 8},
                               std::tuple{2048, 16, 1024, 2, 4}}) {
    ModelSpec m = gpt(h, a, s);
    const double sbh = double(s) * b * h, as_h = double(a) * s / h;
    auto act = [&](int64_t tt, bool sp, const char* rc) {
      return layer_activation_bytes(m, b, s, ActivationOptions{tt, sp, rc, 2.0, false});
    };
    EXPECT_DOUBLE_EQ(act(1, false, "none"), sbh * (34 + 5 * as_h));                  // no parallelism
    EXPECT_DOUBLE_EQ(act(t, false, "none"), sbh * (10 + 24.0 / t + 5 * as_h / t));    // tensor parallel
    EXPECT_DOUBLE_EQ(act(t, true, "none"), sbh / t * (34 + 5 * as_h));                // + sequence parallel
    EXPECT_DOUBLE_EQ(act(t, false, "selective"), sbh * (10 + 24.0 / t));              // + selective recompute
    EXPECT_DOUBLE_EQ(act(t, true, "selective"), sbh * 34 / t);                        // sp + selective
    EXPECT_DOUBLE_EQ(act(1, false, "full"), 2 * sbh);                                 // full recompute
  }
}

TEST(PlanMemory, FlashAttentionAndNoDropoutDropTheQuadraticTerm) {
  ModelSpec m = gpt(4096, 32, 4096);
  double std_bytes = layer_activation_bytes(m, 1, 4096, {1, false, "none", 2.0, false});
  m.attention = "flash", m.dropout = false;
  double flash = layer_activation_bytes(m, 1, 4096, {1, false, "none", 2.0, false});
  const double sbh = 4096.0 * 4096;
  // 34 - 2 masks = 32 sbh, plus one fp32 log-sum-exp per head and token.
  EXPECT_DOUBLE_EQ(flash, sbh * 32 + 4.0 * 32 * 4096);
  EXPECT_GT(std_bytes, 3 * flash);
}

// Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, Nd = 64, K = 12 → 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
TEST(PlanMemory, ZeroModelStatesMatchRajbhandariFigure1) {
  StateBytes sb = state_bytes("bf16", "adam");
  EXPECT_DOUBLE_EQ(sb.weight + sb.grad + sb.optim, 16.0);
  const double psi = 7.5e9;
  EXPECT_NEAR(zero_model_state_bytes(psi, 0, 64, sb) / 1e9, 120.0, 0.05);
  EXPECT_NEAR(zero_model_state_bytes(psi, 1, 64, sb) / 1e9, 31.4, 0.05);
  EXPECT_NEAR(zero_model_state_bytes(psi, 2, 64, sb) / 1e9, 16.6, 0.05);
  EXPECT_NEAR(zero_model_state_bytes(psi, 3, 64, sb) / 1e9, 1.9, 0.05);
  // Muon keeps one moment instead of two.
  EXPECT_DOUBLE_EQ(state_bytes("bf16", "muon").optim, 8.0);
  EXPECT_DOUBLE_EQ(state_bytes("fp32", "adam").optim, 8.0);
}

TEST(PlanMemory, PredictedBreakdownShardsByZeroStage) {
  ModelSpec m = model_preset("llama2-7b");
  Cluster c = make_cluster(find_device("a100-80gb"), 8, 1, 1);
  Layout l;
  l.dp = 8, l.micro_batch = 1;
  Recorder rec;
  double psi = double(m.total_params());
  MemoryBreakdown z0 = predict_memory(m, l, c, rec);
  EXPECT_NEAR(z0.params, 2 * psi, 1);
  EXPECT_NEAR(z0.optimizer, 12 * psi, 1);
  EXPECT_TRUE(z0.oom);  // 16 bytes × 6.7B > 80 GB
  l.zero = 3;
  MemoryBreakdown z3 = predict_memory(m, l, c, rec);
  EXPECT_NEAR(z3.params, 2 * psi / 8, 1);
  EXPECT_NEAR(z3.grads, 2 * psi / 8, 1);
  EXPECT_NEAR(z3.optimizer, 12 * psi / 8, 1);
  EXPECT_FALSE(z3.oom);
  EXPECT_NEAR(z3.margin, z3.capacity - z3.total, 1);
  // Offloading the optimizer removes its state from the device.
  l.offload = "optimizer";
  EXPECT_EQ(predict_memory(m, l, c, rec).optimizer, 0.0);
}

TEST(PlanMemory, PipelineSchedulesKeepDifferentMicroBatchesInFlight) {
  ModelSpec m = gpt(4096, 32, 2048);
  m.layers = 32;
  Cluster c = make_cluster(find_device("a100-80gb"), 8, 1, 1);
  Layout l;
  l.pp = 8, l.dp = 1, l.global_batch = 64, l.micro_batch = 1;
  Recorder rec;
  double per_layer = layer_activation_bytes(m, 1, 2048, {1, false, "none", 2.0, false});
  double one_f_one_b = predict_memory(m, l, c, rec).activations;
  EXPECT_NEAR(one_f_one_b, per_layer * 4 * 8, 1);  // 4 layers × p = 8 micro-batches
  l.schedule = "gpipe";
  EXPECT_NEAR(predict_memory(m, l, c, rec).activations, per_layer * 4 * 64, 1);  // all m
  l.schedule = "interleaved", l.virtual_stages = 2;
  EXPECT_NEAR(predict_memory(m, l, c, rec).activations, per_layer * 4 * 8 * (1 + 7.0 / 16), 1);
}
