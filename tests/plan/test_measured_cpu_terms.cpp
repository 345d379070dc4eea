// Measured terms of the step on a calibrated CPU (issue 16, item 4, session 9): the wait that
// compute between model-parallel collectives adds (`atoll bench comm --gap-us`: a rank done first
// sleeps out its peer's lateness and is woken; back-to-back all-reduces never show it), the
// grouped expert kernel's own efficiency grid, and the linear grid timed with its operands in the
// L3 for steps whose working set fits there. Each is checked against its formula recomputed here,
// read back from a calibration file, and fails if dropped.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "plan/comm_fit.h"
#include "plan/predict.h"

using namespace atl::plan;

namespace {

// A GPU device made to look like a CPU-timed calibration: measured links with a wall-clock fit.
Device calibrated_like() {
  Device d = find_device("a100-80gb");
  d.links_measured = true;
  d.intra_bw = 1.6e9, d.intra_latency = 60e-6;
  d.intra_wall_bw = 1.3e9, d.intra_wall_latency = 150e-6;
  return d;
}

ModelSpec small_gpt() {
  ModelSpec m = model_preset("gpt2-124m");
  m.layers = 2, m.hidden = 128, m.heads = 4, m.kv_heads = 4, m.ffn = 512, m.seq = 128, m.vocab = 257;
  return m;
}

Layout fp32_batch8() {
  Layout l;
  l.micro_batch = 8, l.global_batch = 8, l.precision = "fp32";
  return l;
}

std::string write_calibration(const std::string& extra) {
  auto dir = std::filesystem::temp_directory_path() / "atoll_plan_gap_wait";
  std::filesystem::create_directories(dir);
  auto f = dir / "cal.json";
  std::ofstream(f) << R"({"device":"cpu-local","peak_fp32_flops":1e11,"memory_bytes":1e10,"memory_bandwidth":2e10,)"
                   << R"("gemm_curve":[[1e6,0.5],[1e9,1.0]],"collectives_measured":true,)"
                   << R"("intra_node_bandwidth":1.6e9,"intra_node_latency":6e-5,)"
                   << R"("collective_timing":"process CPU time of rank 0","intra_node_wall_bandwidth":1.3e9,)"
                   << R"("intra_node_wall_latency":1.5e-4)" << extra << "}";
  return f.string();
}

}  // namespace

TEST(PlanGapWait, FitTakesTheWaitAboveBackToBackAgainstTheCompute) {
  // Back to back the wait is 40 µs; with c seconds of compute before the collective it is
  // 40 µs + 25 µs + 0.05·c. Every level has one descheduled iteration (5 ms), which the medians
  // leave out.
  std::map<double, std::vector<std::pair<double, double>>> s;
  for (double gap : {0.0, 250.0, 1000.0, 4000.0})
    for (int i = 0; i < 9; ++i) {
      const double c = 1e-6 * gap * (1.0 + 0.01 * (i - 4));
      const double w = 40e-6 + (gap > 0 ? 25e-6 + 0.05 * c : 0.0) + 1e-7 * (i - 4);
      s[gap].push_back({c, i == 8 ? 5e-3 : w});
    }
  GapWaitFit f = fit_gap_wait(s);
  EXPECT_NEAR(f.base, 40e-6, 1e-6);
  EXPECT_NEAR(f.slope, 0.05, 1e-3);
  EXPECT_NEAR(f.intercept, 25e-6, 1e-6);
  ASSERT_EQ(f.medians.size(), 3u);
  // A level whose wait dips below back to back is no negative cost.
  std::map<double, std::vector<std::pair<double, double>>> flat = {
      {0.0, {{0.0, 50e-6}}}, {100.0, {{1e-4, 45e-6}}}, {1000.0, {{1e-3, 44e-6}}}};
  GapWaitFit z = fit_gap_wait(flat);
  EXPECT_EQ(z.slope, 0.0);
  EXPECT_EQ(z.intercept, 0.0);
  // The back-to-back level and two others are needed.
  EXPECT_THROW(fit_gap_wait({{100.0, {{1e-4, 1e-4}}}, {1000.0, {{1e-3, 1e-4}}}}), atl::Error);
  EXPECT_THROW(fit_gap_wait({{0.0, {{0.0, 1e-4}}}, {1000.0, {{1e-3, 1e-4}}}}), atl::Error);
}

TEST(PlanGapWait, ComputeBetweenTheModelParallelCollectivesAddsTheMeasuredWait) {
  const ModelSpec m = small_gpt();
  Device d = calibrated_like(), none = calibrated_like();
  d.gap_wait_intercept = 30e-6, d.gap_wait_slope = 0.04;
  Layout tp2 = fp32_batch8();
  tp2.tp = 2, tp2.sp = true;
  const Prediction p = predict(m, make_cluster(d, 2, 1, 1), tp2), p0 = predict(m, make_cluster(none, 2, 1, 1), tp2);
  // Blocking points per micro-batch: 4 all-reduces per layer, each an all-gather and a
  // reduce-scatter under sp, the embedding's and the head's (a pair each under sp too:
  // tensor_parallel_ops.cpp) and the loss's two.
  const double points = 2 * 4.0 * m.layers + 2 * 2 + 2;
  ASSERT_GT(p.gap_wait, 0.0);
  EXPECT_DOUBLE_EQ(p.gap_wait_points, points);
  // The compute between two of them: the micro-batch's CPU work (everything but communication)
  // spread over the points.
  const double work = p.compute + p.memory_bound + (p.grad_buffers - p.memory.grads / d.mem_bw);
  EXPECT_NEAR(p.gap_wait_compute, work / points, 1e-9 * work);
  EXPECT_NEAR(p.gap_wait, points * (30e-6 + 0.04 * p.gap_wait_compute), 1e-12);
  // It is part of the wait and of the step, and nothing else moves.
  EXPECT_NEAR(p.sync_wait - p0.sync_wait, p.gap_wait, 1e-12);
  EXPECT_NEAR(p.step - p0.step, p.gap_wait, 1e-12);
  EXPECT_EQ(p0.gap_wait, 0.0);
  // The direction: a larger spread of the compute, a longer step.
  Device wide = d;
  wide.gap_wait_slope = 0.08;
  EXPECT_GT(predict(m, make_cluster(wide, 2, 1, 1), tp2).step, p.step);
  // Without sp each all-reduce is one blocking point.
  Layout nosp = tp2;
  nosp.sp = false;
  EXPECT_DOUBLE_EQ(predict(m, make_cluster(d, 2, 1, 1), nosp).gap_wait_points, 4.0 * m.layers + 4);
  // cp2: the ring's hops, 3·cp − 2 per layer.
  Layout cp2 = fp32_batch8();
  cp2.cp = 2;
  const Prediction pc = predict(m, make_cluster(d, 2, 1, 1), cp2);
  EXPECT_DOUBLE_EQ(pc.gap_wait_points, 4.0 * m.layers);
  EXPECT_GT(pc.gap_wait, 0.0);
  // Data parallelism's one all-reduce after the backward is not a model-parallel collective, one
  // rank has none, and an overridden link is not the calibrated one.
  Layout dp2 = fp32_batch8();
  dp2.dp = 2, dp2.global_batch = 16;
  EXPECT_EQ(predict(m, make_cluster(d, 2, 1, 1), dp2).gap_wait, 0.0);
  EXPECT_EQ(predict(m, make_cluster(d, 1, 1, 1), fp32_batch8()).gap_wait, 0.0);
  Cluster over = make_cluster(d, 2, 1, 1);
  over.intra.latency = 10e-6;
  EXPECT_EQ(predict(m, over, tp2).gap_wait, 0.0);
}

TEST(PlanGapWait, CalibrationFileCarriesTheFit) {
  Device d = device_from_calibration(write_calibration(R"(,"gap_wait":{"intercept_s":2.5e-5,"slope":0.03})"));
  EXPECT_DOUBLE_EQ(d.gap_wait_intercept, 2.5e-5);
  EXPECT_DOUBLE_EQ(d.gap_wait_slope, 0.03);
  EXPECT_EQ(device_from_calibration(write_calibration("")).gap_wait_slope, 0.0);
  try {
    device_from_calibration(write_calibration(R"(,"gap_wait":{"intercept_s":2.5e-5,"slope":-1})"));
    ADD_FAILURE() << "a negative slope was accepted";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gap_wait"), std::string::npos) << e.what();
  }
  EXPECT_THROW(device_from_calibration(write_calibration(R"(,"gap_wait":{"slope":0.1})")), atl::Error);
}

TEST(PlanExpertCurve, ExpertsRunAtTheGroupedKernelsMeasuredRate) {
  ModelSpec m = small_gpt();
  m.experts = 16, m.top_k = 2, m.expert_ffn = 64, m.shared_experts = 2, m.first_dense_layers = 1;
  // Rows per expert below 100 at a quarter of the efficiency of longer ones.
  std::vector<std::array<double, 4>> g;
  for (double r : {32.0, 512.0})
    for (double c : {64.0, 256.0})
      for (double oc : {64.0, 256.0}) g.push_back({r, c, oc, r < 100 ? 0.1 : 0.4});
  Device d = find_device("a100-80gb"), flat = d;
  d.expert_curve = g;
  EXPECT_DOUBLE_EQ(d.expert_efficiency(32, 64, 256), 0.1);
  EXPECT_NEAR(d.expert_efficiency(128, 128, 128), 0.25, 1e-9);  // log-middle of 32 and 512
  EXPECT_DOUBLE_EQ(flat.expert_efficiency(128, 128, 64), flat.gemm_efficiency(2.0 * 128 * 128 * 64));
  Layout one = fp32_batch8();
  Layout ep2 = one;
  ep2.dp = 2, ep2.ep = 2, ep2.global_batch = 16;
  for (const Layout& l : {one, ep2}) {
    const Cluster c = make_cluster(d, l.dp, 1, 1), cf = make_cluster(flat, l.dp, 1, 1);
    // The routed experts' GEMMs recomputed: 1 MoE layer, 3× for forward and backward, each of the
    // local experts 2·rows·h·f twice (up and down), rows = b·s·top_k·ep / experts.
    const double rows = 8.0 * m.seq * m.top_k * l.ep / m.experts, h = double(m.hidden), f = double(m.expert_ffn);
    const double local = double(m.experts) / l.ep, peak = d.peak("fp32");
    auto experts = [&](const Device& x) {
      auto one_gemm = [&](double k, double n) {
        const double flops = 2 * rows * n * k;
        return x.expert_curve.empty()
                   ? std::max(flops / (peak * x.gemm_efficiency(flops, "fp32")), 4.0 * (rows * k + k * n + rows * n) / x.mem_bw)
                   : flops / (peak * x.expert_efficiency(rows, k, n));
      };
      return 3.0 * local * (one_gemm(h, f) + one_gemm(f, h));
    };
    const Prediction p = predict(m, c, l), pf = predict(m, cf, l);
    EXPECT_NEAR((p.compute + p.memory_bound) - (pf.compute + pf.memory_bound), experts(d) - experts(flat),
                1e-9 * p.compute)
        << "ep=" << l.ep;
    // The direction: the same grid measured faster everywhere shortens the step.
    Device fast = d;
    for (auto& x : fast.expert_curve) x[3] = 0.4;
    EXPECT_GT(p.step, predict(m, make_cluster(fast, l.dp, 1, 1), l).step) << "ep=" << l.ep;
  }
  // The calibration file's grid is read, and checked like linear_curve.
  std::string cal = write_calibration(R"(,"expert_curve":[[32,64,64,0.1],[32,64,256,0.1],[32,256,64,0.1],)"
                                      R"([32,256,256,0.1],[512,64,64,0.4],[512,64,256,0.4],[512,256,64,0.4],)"
                                      R"([512,256,256,0.4]])");
  EXPECT_NEAR(device_from_calibration(cal).expert_efficiency(128, 128, 128), 0.25, 1e-9);
  try {
    device_from_calibration(write_calibration(R"(,"expert_curve":[[32,64,64,0.1],[32,64,256,0.1],[32,256,64,0.1]])"));
    ADD_FAILURE() << "an incomplete grid was accepted";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expert_curve"), std::string::npos) << e.what();
  }
}

TEST(PlanCacheResidentGrid, AStepThatFitsInTheL3TakesTheCacheResidentGrid) {
  const ModelSpec m = small_gpt();
  auto flat = [](double e) {
    std::vector<std::array<double, 4>> g;
    for (double n : {256.0, 4096.0})
      for (double c : {64.0, 512.0})
        for (double oc : {64.0, 512.0}) g.push_back({n, c, oc, e});
    return g;
  };
  Device cold = calibrated_like();
  cold.linear_curve = flat(0.4);
  Device warm = cold;
  warm.linear_curve = flat(0.8);
  Device both = cold;
  both.linear_curve_l3 = flat(0.8);
  // The mix: a share f of the work at the warm grid's efficiency, the rest at the cold one's.
  EXPECT_NEAR(both.linear_efficiency(1024, 128, 128, 0.25), 1.0 / (0.25 / 0.8 + 0.75 / 0.4), 1e-12);
  EXPECT_DOUBLE_EQ(both.linear_efficiency(1024, 128, 128, 0.0), 0.4);
  const Layout one = fp32_batch8();
  const Cluster c1 = make_cluster(cold, 1, 1, 1);
  const Prediction pc = predict(m, c1, one), pw = predict(m, make_cluster(warm, 1, 1, 1), one);
  // No L3 size known: the cold grid, whatever the second grid says.
  EXPECT_DOUBLE_EQ(predict(m, make_cluster(both, 1, 1, 1), one).compute, pc.compute);
  const auto& mm = pc.memory;
  const double ws = mm.params + mm.grads + mm.optimizer + mm.activations;
  // The working set fits: every linear at the warm grid's rate.
  both.l3_bytes = 2 * ws;
  const Prediction pb = predict(m, make_cluster(both, 1, 1, 1), one);
  EXPECT_DOUBLE_EQ(pb.operands_in_l3, 1.0);
  EXPECT_NEAR(pb.compute, pw.compute, 1e-12);
  EXPECT_LT(pb.compute, pc.compute);
  // A quarter of it fits: the linears' time is a quarter at the warm rate, three quarters cold.
  both.l3_bytes = ws / 4;
  const Prediction pq = predict(m, make_cluster(both, 1, 1, 1), one);
  EXPECT_NEAR(pq.operands_in_l3, 0.25, 1e-12);
  EXPECT_NEAR(pq.compute - pw.compute, 0.75 * (pc.compute - pw.compute), 1e-9 * pc.compute);
  // Two ranks of a node that share its L3 (a CPU) each get half of it.
  both.l3_bytes = 2 * ws, both.shared_by_node = true;
  Layout dp2 = one;
  dp2.dp = 2, dp2.global_batch = 16;
  const Prediction p2 = predict(m, make_cluster(both, 2, 1, 1), dp2);
  EXPECT_NEAR(p2.operands_in_l3, std::min(1.0, 2 * ws / (2 * (p2.memory.params + p2.memory.grads + p2.memory.optimizer +
                                                                p2.memory.activations))), 1e-12);
  // The file's grid and cache size are read; an L3 grid without the cold one is refused.
  std::string lin = "[[1024,64,64,0.5],[1024,64,128,0.6],[1024,128,64,0.6],[1024,128,128,0.7]]";
  Device f = device_from_calibration(
      write_calibration(",\"linear_curve\":" + lin + ",\"linear_curve_l3\":" + lin + ",\"l3_bytes\":5e8"));
  EXPECT_EQ(f.linear_curve_l3.size(), 4u);
  EXPECT_DOUBLE_EQ(f.l3_bytes, 5e8);
  try {
    device_from_calibration(write_calibration(",\"linear_curve_l3\":" + lin));
    ADD_FAILURE() << "an L3 grid without the cold grid was accepted";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_curve_l3"), std::string::npos) << e.what();
  }
}

TEST(PlanZeroPageFaults, NonOwnedPagesFaultBackInAtTheMeasuredRate) {
  const ModelSpec m = small_gpt();
  Device d = calibrated_like(), none = calibrated_like();
  d.page_fault_bw = 2e9;
  Layout z3 = fp32_batch8();
  z3.dp = 2, z3.zero = 3, z3.global_batch = 32;  // 2 micro-batches per rank
  const Prediction p = predict(m, make_cluster(d, 2, 1, 1), z3), p0 = predict(m, make_cluster(none, 2, 1, 1), z3);
  // fp32 values (4 B) gathered twice and fp32 gradients (4 B) once per micro-batch, the half of
  // them this rank does not own.
  const double per_mb = (2 * 4.0 + 4.0) * p.memory.params_per_device * 0.5;
  EXPECT_NEAR(p.page_faults, 2 * per_mb / 2e9, 1e-12);
  EXPECT_GT(p.page_faults, 0.0);
  EXPECT_NEAR(p.step - p0.step, p.page_faults, 1e-12);
  // Not sharded, or sharded only in optimizer state: nothing is given back.
  Layout z1 = z3;
  z1.zero = 1;
  EXPECT_EQ(predict(m, make_cluster(d, 2, 1, 1), z1).page_faults, 0.0);
  Layout one = fp32_batch8();
  one.zero = 3;
  EXPECT_EQ(predict(m, make_cluster(d, 1, 1, 1), one).page_faults, 0.0);
  EXPECT_EQ(p0.page_faults, 0.0);
  EXPECT_DOUBLE_EQ(device_from_calibration(write_calibration(R"(,"page_fault_bandwidth":3e9)")).page_fault_bw, 3e9);
  EXPECT_THROW(device_from_calibration(write_calibration(R"(,"page_fault_bandwidth":-1)")), atl::Error);
}
