// Which flash-attention kernel a run used, and what recompute repeats of it (issue 16, session 7):
// the Triton FlashAttention at FlashAttention-2's published share of its speed (Dao 2023 §4.1:
// FA2 is ~1.3-1.5× faster forward, ~2× backward), and recompute charged the attention core's
// forward only, not the forward with the flash backward folded in.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "plan/predict.h"
#include "plan/validation.h"

using namespace atl::plan;

namespace {
// 13B-class heads at 32K tokens on an A100: every call sits at the kernel's ceilings, so the
// times below are exact formulas (the memory term, Q/K/V/O only, is ~1e-4 of the compute).
ModelSpec long_context(const char* kernel) {
  ModelSpec m = model_preset("gpt2-124m");
  m.attention = "flash", m.attention_kernel = kernel;
  m.seq = 32768, m.hidden = 5120, m.heads = m.kv_heads = 40, m.ffn = 4 * 5120;
  return m;
}
const double kNonCausal = 40 * 2.0 * 32768.0 * 32768.0 * (128 + 128);
const double kFwd = kNonCausal / 1.75 / (312e12 * 0.73), kBwd = 2.5 * kNonCausal / 1.75 / (312e12 * 0.63);
}  // namespace

TEST(PlanFlashKernel, TritonRunsAtFlashAttention2sPublishedShare) {
  Device d = find_device("a100-80gb");
  Layout l;
  // FlashAttention-2: forward at 73% of peak, backward at 63% (FlashAttention-2 §1).
  EXPECT_NEAR(3 * attention_core_time(long_context("flash2"), l, d), kFwd + kBwd, 1e-9 * (kFwd + kBwd));
  // Triton: 1.4× the forward time, 2× the backward's.
  const ModelSpec tri = long_context("triton");
  EXPECT_NEAR(flash_forward_ceiling(d, tri), 0.73 / 1.4, 1e-12);
  EXPECT_NEAR(flash_backward_ceiling(d, tri), 0.63 / 2.0, 1e-12);
  EXPECT_NEAR(3 * attention_core_time(tri, l, d), 1.4 * kFwd + 2.0 * kBwd, 1e-9 * (kFwd + kBwd));
  // Whole steps: the slower kernel makes the step slower, by no more than its attention time grew.
  Cluster c = make_cluster(d, 8, 1, 1);
  l.dp = 8, l.zero = 3, l.global_batch = 8, l.precision = "bf16", l.recompute = "full";
  const Prediction p2 = predict(long_context("flash2"), c, l), pt = predict(tri, c, l);
  const double grown = tri.layers * ((1.4 * kFwd + 2.0 * kBwd) - (kFwd + kBwd) + (1.4 - 1.0) * kFwd);  // + recompute
  EXPECT_GT(pt.step, p2.step);
  EXPECT_NEAR(pt.step - p2.step, grown, 0.01 * grown);
  // --explain names the kernel and its ceilings under time.compute.
  PredictOptions ex;
  ex.explain = true;
  bool named = false;
  for (auto& f : predict(tri, c, l, ex).figures)
    if (f.key == "time.compute") named = f.formula.find("Triton FlashAttention") != std::string::npos;
  EXPECT_TRUE(named);
  // A standard-attention model has no flash kernel to choose.
  ModelSpec bad = long_context("triton");
  bad.attention = "standard";
  EXPECT_THROW(bad.validate(), atl::Error);
}

TEST(PlanFlashKernel, MosaicMlTablesRanTheTritonKernelAndItMovesThemTowardTheirFigures) {
  // llm-foundry's benchmark script defaults to attn_impl: triton; the extended set says so for
  // every MosaicML run. Each such run predicted with FlashAttention-2 instead is faster, i.e. the
  // Triton kernel moves the (optimistic) predictions down toward the published throughput, and
  // most where attention is the largest share (the 32K-token run).
  auto runs = load_extended(std::string(ATOLL_SOURCE_DIR) + "/configs/plan/validation/extended.toml");
  int mosaic = 0;
  double gain_32k = 0, gain_max_other = 0;
  for (auto& r : runs) {
    if (r.source.find("MosaicML") == std::string::npos) continue;
    ++mosaic;
    EXPECT_EQ(r.model.attention_kernel, "triton") << r.id;
    ModelSpec fa2 = r.model;
    fa2.attention_kernel = "flash2";
    const double with_triton = predict(r.model, r.cluster, r.layout).tokens_per_s_device;
    const double with_fa2 = predict(fa2, r.cluster, r.layout).tokens_per_s_device;
    EXPECT_LT(with_triton, with_fa2) << r.id;
    const double gain = with_fa2 / with_triton - 1;
    if (r.model.seq >= 32768) gain_32k = gain;
    else gain_max_other = std::max(gain_max_other, gain);
    // Within the bound on the extended set either way round.
    EXPECT_LE(std::fabs(with_triton / r.published - 1), 0.25) << r.id;
  }
  EXPECT_GE(mosaic, 9);
  EXPECT_GT(gain_32k, gain_max_other);
}

TEST(PlanFlashKernel, RecomputeRepeatsOnlyTheAttentionForward) {
  Device d = find_device("a100-80gb");
  Cluster c = make_cluster(d, 1, 1, 1);
  Layout l;
  l.global_batch = 1, l.precision = "bf16";
  for (const char* kernel : {"flash2", "triton"}) {
    ModelSpec m = long_context(kernel);
    m.layers = 4, m.vocab = 8;  // a negligible output head
    const double fwd = (std::string(kernel) == "triton" ? 1.4 : 1.0) * kFwd;
    // Selective recompute repeats the attention core's forward: one forward time per layer, not
    // the third of forward + backward that the layer's forward carries.
    l.recompute = "selective";
    const Prediction sel = predict(m, c, l);
    EXPECT_NEAR(sel.recompute, m.layers * fwd, 1e-6 * sel.recompute) << kernel;
    // Full recompute repeats the layers' forward with that attention forward.
    // One layer's forward as the step carries it: the difference of two depths (the head cancels).
    l.recompute = "none";
    const Prediction none = predict(m, c, l);
    ModelSpec shallower = m;
    shallower.layers -= 1;
    const Prediction none1 = predict(shallower, c, l);
    const double layer_fwd = (none.compute + none.memory_bound - none1.compute - none1.memory_bound) / 3;
    l.recompute = "full";
    const Prediction full = predict(m, c, l);
    const double folded = attention_core_time(m, Layout{}, d);  // forward + backward over 3
    EXPECT_NEAR(full.recompute, m.layers * (layer_fwd - (folded - fwd)), 1e-6 * full.recompute) << kernel;
    EXPECT_LT(full.recompute, m.layers * layer_fwd) << kernel;
  }
}
