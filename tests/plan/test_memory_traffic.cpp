// The step-time terms for memory traffic outside the GEMMs: gradient buffers (zero-filled
// activation gradients, bias-gradient sums, the logits gradient, parameter-gradient zeroing), the
// optimizer's bytes per parameter and its measured-rate bound, the measured attention curve, and
// GEMMs whose operand traffic does not overlap their arithmetic (a CPU BLAS). Each is checked
// against its formula recomputed here from the model's shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "plan/memory_model.h"
#include "plan/predict.h"

using namespace atl::plan;

namespace {
Cluster one(const Device& d) { return make_cluster(d, 1, 1, 1); }
}  // namespace

TEST(PlanMemoryTraffic, GradientBuffersFollowTheirFormula) {
  // GPT-2 124M (biases, GELU MLP of 4h, vocabulary 50257) on one H100, 2 micro-batches of 2.
  ModelSpec m = model_preset("gpt2-124m");
  Device d = find_device("h100-sxm");
  Layout l;
  l.micro_batch = 2, l.global_batch = 4, l.precision = "bf16";
  Prediction p = predict(m, one(d), l);
  const double b = 2, s = double(m.seq), h = double(m.hidden), e = 2;
  ActivationOptions ao{1, false, "none", e, false};
  const double act = layer_activation_bytes(m, 2, m.seq, ao);
  const double bias = e * b * s * (3 * h + h + 4 * h + h);  // QKV, projection, fc, fc-proj outputs
  const double logits = 4.0 * b * s * double(m.vocab);
  const double per_micro = double(m.layers) * (act + bias) + logits;
  // Zeroing the parameter gradients once, and accumulating the second micro-batch's gradients into
  // them: read the buffer, read the new gradient, write the buffer (3 × gradient bytes).
  const double expected = (2 * per_micro + p.memory.grads + (2 - 1) * 3 * p.memory.grads) / d.mem_bw;
  EXPECT_NEAR(p.grad_buffers / expected, 1.0, 1e-12);
  // It is part of the step and never larger than the activation traffic of the element-wise work.
  EXPECT_GT(p.grad_buffers, 0.0);
  EXPECT_LT(p.grad_buffers, p.memory_bound);
}

TEST(PlanMemoryTraffic, NoBiasNoBiasGradientReads) {
  ModelSpec m = model_preset("gpt2-124m");
  Device d = find_device("a100-80gb");
  Layout l;
  l.micro_batch = 1, l.global_batch = 1;
  Prediction with = predict(m, one(d), l);
  m.bias = false;
  Prediction without = predict(m, one(d), l);
  const double h = double(m.hidden), s = double(m.seq);
  const double bias_reads = double(m.layers) * 2.0 * s * 9 * h / d.mem_bw;
  // Biases also change the gradient bytes zeroed per step (fewer parameters).
  const double grads = (with.memory.grads - without.memory.grads) / d.mem_bw;
  EXPECT_NEAR(with.grad_buffers - without.grad_buffers, bias_reads + grads, 1e-9 * with.grad_buffers);
}

TEST(PlanMemoryTraffic, AdamStreamsItsStateGradientTwiceAndWeights) {
  ModelSpec m = model_preset("gpt2-124m");
  Device d = find_device("h100-sxm");
  Layout l;
  l.micro_batch = 1, l.global_batch = 1;
  for (auto [prec, bytes] : {std::pair<const char*, double>{"fp32", 2 * 8 + 2 * 4 + 2 * 4},  // m,v; g×2; w r+w
                             {"bf16", 2 * 12 + 2 * 2 + 2}}) {                               // master,m,v; g×2; w
    l.precision = prec;
    Prediction p = predict(m, one(d), l);
    EXPECT_NEAR(p.optimizer, p.memory.params_per_device * bytes / d.mem_bw, 1e-12) << prec;
  }
}

TEST(PlanMemoryTraffic, MeasuredUpdateRateBoundsTheOptimizer) {
  ModelSpec m = model_preset("gpt2-124m");
  Device d = find_device("h100-sxm");
  Layout l;
  l.micro_batch = 1, l.global_batch = 1, l.precision = "fp32";
  Prediction bytes_bound = predict(m, one(d), l);
  d.optimizer_params_per_s = 1e8;  // slower than streaming 32 B/param at 3.35 TB/s
  Prediction rate_bound = predict(m, one(d), l);
  EXPECT_NEAR(rate_bound.optimizer, rate_bound.memory.params_per_device / 1e8, 1e-12);
  EXPECT_GT(rate_bound.optimizer, bytes_bound.optimizer);
  d.optimizer_params_per_s = 1e15;  // faster than the bytes: the bytes stay the bound
  EXPECT_DOUBLE_EQ(predict(m, one(d), l).optimizer, bytes_bound.optimizer);
}

TEST(PlanMemoryTraffic, AttentionCurveInterpolatesAndReplacesTheSingleRate) {
  Device d = find_device("h100-sxm");
  d.attention_flops = 7e12;
  EXPECT_DOUBLE_EQ(d.attention_rate(1e9), 7e12);  // no curve: the single rate
  d.attention_curve = {{1e8, 4e12}, {1e10, 2e12}};
  EXPECT_DOUBLE_EQ(d.attention_rate(1e6), 4e12);   // clamped below
  EXPECT_DOUBLE_EQ(d.attention_rate(1e12), 2e12);  // and above
  EXPECT_NEAR(d.attention_rate(1e9), 3e12, 1e-3);  // log-linear in between

  // In a prediction, a flat curve at rate R gives exactly what the single rate R gives.
  ModelSpec m = model_preset("gpt2-124m");
  Layout l;
  l.micro_batch = 1, l.global_batch = 1;
  Device flat = find_device("h100-sxm");
  flat.attention_flops = 5e12;
  Prediction a = predict(m, one(flat), l);
  flat.attention_curve = {{1e6, 5e12}, {1e12, 5e12}};
  flat.attention_flops = 1;  // ignored when a curve exists
  Prediction c = predict(m, one(flat), l);
  EXPECT_NEAR(c.compute / a.compute, 1.0, 1e-12);
  // Halving the curve's rates adds exactly the attention cores' time once more: 3 × (fwd) per layer.
  for (auto& pt : flat.attention_curve) pt.second /= 2;
  Prediction slow = predict(m, one(flat), l);
  const double s = double(m.seq), dh = double(m.hidden) / m.heads;
  const double core = double(m.layers) * 3 * m.heads * 2.0 * s * s * 2 * dh / 5e12;
  EXPECT_NEAR(slow.compute - c.compute, core, 1e-9 * slow.compute);
}

// Issue 16, item 4: a cp rank's attention runs the ring's block kernels, at their own measured
// rate (ring_attention_curve), not the fused causal kernel's. Without the curve nothing changes;
// with it at half the fused rate, the cp2 step gains exactly its attention cores' time once more
// (3 × the rank's forward FLOPs per layer at the fused rate) and a cp = 1 step is unchanged.
TEST(PlanMemoryTraffic, RingAttentionRunsAtTheBlockKernelsMeasuredRate) {
  ModelSpec m = model_preset("gpt2-124m");
  Layout l;
  l.micro_batch = 1, l.global_batch = 1, l.cp = 2;
  Device d = find_device("h100-sxm");
  d.attention_curve = {{1e6, 5e12}, {1e12, 5e12}};
  EXPECT_DOUBLE_EQ(d.ring_attention_rate(1e9), 5e12);  // no ring curve: the fused kernel's rate
  Cluster c = make_cluster(d, 2, 1, 1);
  Prediction fused = predict(m, c, l);
  Layout one_rank = l;
  one_rank.cp = 1;
  Prediction single = predict(m, make_cluster(d, 1, 1, 1), one_rank);
  d.ring_attention_curve = {{1e6, 2.5e12}, {1e12, 2.5e12}};
  EXPECT_DOUBLE_EQ(d.ring_attention_rate(1e9), 2.5e12);
  Prediction ring = predict(m, make_cluster(d, 2, 1, 1), l);
  const double s_local = double(m.seq) / 2, dh = double(m.hidden) / m.heads;
  const double core = double(m.layers) * 3 * m.heads * 2.0 * s_local * double(m.seq) * 2 * dh / 5e12;
  EXPECT_NEAR(ring.compute - fused.compute, core, 1e-9 * ring.compute);
  EXPECT_DOUBLE_EQ(predict(m, make_cluster(d, 1, 1, 1), one_rank).compute, single.compute);
}

TEST(PlanMemoryTraffic, NonOverlappingGemmAddsItsOperandTraffic) {
  Device d = find_device("h100-sxm");
  const double m = 2048, n = 64, k = 64, eb = 4;
  const double flops = 2 * m * n * k;
  const double compute = flops / (d.peak("fp32") * d.gemm_efficiency(flops));
  const double memory = eb * (m * k + k * n + m * n) / d.mem_bw;
  EXPECT_DOUBLE_EQ(d.gemm_time(m, n, k, "fp32", eb), std::max(compute, memory));
  d.gemm_overlaps_memory = false;
  EXPECT_NEAR(d.gemm_time(m, n, k, "fp32", eb), compute + memory, 1e-18);
}

TEST(PlanMemoryTraffic, CalibrationFileCarriesTheMeasuredRates) {
  auto cal = std::filesystem::temp_directory_path() / "atoll_plan_test_traffic.json";
  {
    std::ofstream f(cal);
    f << R"({"peak_fp32_flops": 1e11, "memory_bytes": 8e9, "memory_bandwidth": 2e10,
             "gemm_curve": [[1e6, 0.5], [1e9, 1.0]], "attention_flops": 4e10,
             "attention_curve": [[1e9, 3e10], [1e8, 5e10]], "optimizer_params_per_s": 4e8})";
  }
  Device d = device_from_calibration(cal.string());
  std::filesystem::remove(cal);
  EXPECT_FALSE(d.gemm_overlaps_memory);  // a CPU BLAS packs its operands in passes of their own
  ASSERT_EQ(d.attention_curve.size(), 2u);
  EXPECT_DOUBLE_EQ(d.attention_curve.front().first, 1e8);  // sorted on load
  EXPECT_DOUBLE_EQ(d.optimizer_params_per_s, 4e8);
  // Two ranks on the calibrated machine each get half of every measured rate.
  Cluster c = make_cluster(d, 2, 1, 1);
  EXPECT_DOUBLE_EQ(c.device.optimizer_params_per_s, 2e8);
  EXPECT_DOUBLE_EQ(c.device.attention_curve.front().second, 2.5e10);
  EXPECT_DOUBLE_EQ(c.device.attention_rate(1e9), 1.5e10);
}
