// Three terms of the step on a calibrated CPU (issue 16, item 4: the self-check against atoll's
// own runs): linear layers timed on the measured token-major curve instead of the square-GEMM
// curve (tp shards are thin), the sleep in blocking collectives priced from the calibration's
// wall-clock fit of the same all-reduces, and expert parallelism's pack/unpack copies. Each is
// checked against its formula recomputed here, and each test fails if its term is dropped.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "plan/predict.h"

using namespace atl::plan;

namespace {

// A GPU device made to look calibrated: measured links (used as given), no operand-traffic
// overlap question for the linear curve (its time is compute only).
Device calibrated_like() {
  Device d = find_device("a100-80gb");
  d.links_measured = true;
  return d;
}

// A 2 × 2 × 2 grid where a thin side (64) runs at half the efficiency of a wide one (512).
std::vector<std::array<double, 4>> thin_is_slow() {
  std::vector<std::array<double, 4>> g;
  for (double n : {256.0, 4096.0})
    for (double c : {64.0, 512.0})
      for (double oc : {64.0, 512.0}) g.push_back({n, c, oc, (c < 100 || oc < 100) ? 0.4 : 0.8});
  return g;
}

ModelSpec small_gpt() {
  ModelSpec m = model_preset("gpt2-124m");
  m.layers = 2, m.hidden = 128, m.heads = 4, m.kv_heads = 4, m.ffn = 512, m.seq = 128, m.vocab = 257;
  return m;
}

}  // namespace

TEST(PlanLinearCurve, InterpolatesInTheLogsOfTheThreeSizesAndClampsAtTheEdges) {
  Device d = calibrated_like();
  d.linear_curve = thin_is_slow();
  EXPECT_DOUBLE_EQ(d.linear_efficiency(256, 64, 512), 0.4);
  EXPECT_DOUBLE_EQ(d.linear_efficiency(4096, 512, 512), 0.8);
  // Geometric middle of 64 and 512 on one axis: halfway between 0.4 and 0.8.
  EXPECT_NEAR(d.linear_efficiency(1024, 181.019336, 512), 0.6, 1e-6);
  // Outside the grid: its edge.
  EXPECT_DOUBLE_EQ(d.linear_efficiency(32, 16, 4096), 0.4);
  EXPECT_DOUBLE_EQ(d.linear_efficiency(1e6, 1e4, 1e4), 0.8);
  // A one-value axis is constant along it.
  d.linear_curve = {{1024, 64, 64, 0.5}, {1024, 64, 512, 0.7}, {1024, 512, 64, 0.7}, {1024, 512, 512, 0.9}};
  EXPECT_DOUBLE_EQ(d.linear_efficiency(16, 512, 512), 0.9);
  // No curve: the square curve at the same FLOPs.
  d.linear_curve.clear();
  EXPECT_DOUBLE_EQ(d.linear_efficiency(1024, 128, 384), d.gemm_efficiency(2.0 * 1024 * 128 * 384));
}

TEST(PlanLinearCurve, TensorShardsRunAtTheirOwnThinShapesRate) {
  // A 512-wide layer whose tp2 shards have sides of 256: on a measured curve where sides below
  // 300 run at half the rate, the shard's linear layers take as long as the whole layer's, where
  // the square curve (same FLOPs efficiency) halves them.
  ModelSpec m = small_gpt();
  m.hidden = 512, m.heads = 8, m.kv_heads = 8, m.ffn = 512, m.vocab = 512;
  auto grid = [](double thin, double wide) {
    std::vector<std::array<double, 4>> g;
    for (double n : {256.0, 4096.0})
      for (double c : {256.0, 512.0})
        for (double oc : {256.0, 512.0}) g.push_back({n, c, oc, (c < 300 || oc < 300) ? thin : wide});
    return g;
  };
  Device flat = calibrated_like(), thin = calibrated_like();
  flat.linear_curve = grid(0.8, 0.8), thin.linear_curve = grid(0.4, 0.8);
  Layout one, tp2;
  one.micro_batch = tp2.micro_batch = 8, one.global_batch = tp2.global_batch = 8, one.precision = tp2.precision = "fp32";
  tp2.tp = 2;
  auto compute = [&](const Device& d, const Layout& l) { return predict(m, make_cluster(d, l.tp, 1, 1), l).compute; };
  // The linear layers' forward time recomputed (QKV, projection, fc, fc2 per layer, the head), 3×
  // for forward and backward; the attention cores are the same on both devices and cancel.
  const double T = 8.0 * m.seq, h = double(m.hidden), peak = flat.peak("fp32");
  auto linears = [&](const Device& d, double tp) {
    auto lin = [&](double n, double k) { return 2 * T * n * k / (peak * d.linear_efficiency(T, k, n)); };
    const double layer = lin(3 * h / tp, h) + lin(h, h / tp) + lin(m.ffn / tp, h) + lin(h, m.ffn / tp);
    return 3.0 * (double(m.layers) * layer + lin(double(m.vocab) / tp, h));
  };
  for (const Layout& l : {one, tp2}) {
    const double tp = double(l.tp);
    EXPECT_NEAR(compute(thin, l) - compute(flat, l), linears(thin, tp) - linears(flat, tp), 1e-9 * compute(thin, l));
  }
  // Whole layer: every side ≥ 512, so the thin curve costs nothing more. The shard: its
  // projection, MLP and head (3.5 of its 6.5 units of FLOPs; QKV's 768 × 512 stays wide) at half
  // the rate, (3 + 2 × 3.5) / 6.5 = 1.54× the flat curve's time.
  EXPECT_NEAR(compute(thin, one), compute(flat, one), 1e-12);
  EXPECT_NEAR(linears(thin, 2) / linears(flat, 2), 10.0 / 6.5, 1e-9);
  EXPECT_GT(compute(thin, tp2), compute(flat, tp2) + 0.5 * linears(flat, 2));
}

TEST(PlanLinearCurve, CalibrationFileMustHoldAFullGrid) {
  auto dir = std::filesystem::temp_directory_path() / "atoll_plan_linear_curve";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& curve) {
    auto f = dir / "cal.json";
    std::ofstream(f) << R"({"device":"cpu-local","peak_fp32_flops":1e11,"memory_bytes":1e10,"memory_bandwidth":2e10,)"
                     << R"("gemm_curve":[[1e6,0.5],[1e9,1.0]],"linear_curve":)" << curve << "}";
    return f.string();
  };
  Device ok = device_from_calibration(write("[[1024,64,64,0.5],[1024,64,128,0.6],[1024,128,64,0.6],[1024,128,128,0.7]]"));
  ASSERT_EQ(ok.linear_curve.size(), 4u);
  EXPECT_DOUBLE_EQ(ok.linear_efficiency(1024, 128, 128), 0.7);
  try {
    device_from_calibration(write("[[1024,64,64,0.5],[1024,64,128,0.6],[1024,128,64,0.6]]"));
    ADD_FAILURE() << "a grid with a missing shape was accepted";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear_curve"), std::string::npos) << e.what();
  }
  EXPECT_THROW(device_from_calibration(write("[[1024,64,64,0]]")), atl::Error);
  std::filesystem::remove_all(dir);
}

TEST(PlanSyncWait, TheWallClockFitPricesTheSleepInBlockingCollectives) {
  ModelSpec m = small_gpt();
  Device d = calibrated_like();
  d.intra_bw = 1.6e9, d.intra_latency = 60e-6;            // by CPU time
  d.intra_wall_bw = 1.3e9, d.intra_wall_latency = 150e-6;  // by the wall clock, same all-reduces
  Layout tp2;
  tp2.micro_batch = 8, tp2.global_batch = 8, tp2.precision = "fp32", tp2.tp = 2, tp2.sp = true;
  const Cluster c = make_cluster(d, 2, 1, 1);
  const Prediction p = predict(m, c, tp2);
  // The same layout with the wall-clock fit as the link, and no second pricing.
  Device w = d;
  w.intra_bw = d.intra_wall_bw, w.intra_latency = d.intra_wall_latency, w.intra_wall_bw = 0;
  const Prediction pw = predict(m, make_cluster(w, 2, 1, 1), tp2);
  ASSERT_GT(p.sync_wait, 0.0);
  EXPECT_NEAR(p.step, pw.step, 1e-12 * pw.step);
  EXPECT_NEAR(p.sync_wait, pw.step - (p.step - p.sync_wait), 1e-12 * p.step);
  // Every collective of tp2 is latency-bound at this size: the wait is most of the added latency.
  const double comm = p.tp.total() + p.control.total();
  EXPECT_GT(p.sync_wait, 0.5 * comm * (150.0 / 60.0 - 1.0) * 0.5);
  // One rank has no collective: no wait. A [cluster] link override is not the calibrated link.
  Layout one = tp2;
  one.tp = 1, one.sp = false;
  EXPECT_EQ(predict(m, make_cluster(d, 1, 1, 1), one).sync_wait, 0.0);
  Cluster over = c;
  over.intra.latency = 10e-6;
  EXPECT_EQ(predict(m, over, tp2).sync_wait, 0.0);
  // Without a wall-clock fit (GPU catalogue devices), none.
  EXPECT_EQ(predict(m, make_cluster(find_device("a100-80gb"), 2, 1, 1), tp2).sync_wait, 0.0);
}

TEST(PlanEpCopies, EveryExchangePacksAndUnpacksTheRoutedRows) {
  ModelSpec m = small_gpt();
  m.experts = 16, m.top_k = 2, m.expert_ffn = 64, m.shared_experts = 2, m.first_dense_layers = 1;
  Device d = calibrated_like();
  Layout ep2;
  ep2.micro_batch = 8, ep2.global_batch = 32, ep2.precision = "fp32", ep2.dp = 2, ep2.ep = 2;
  const Prediction p = predict(m, make_cluster(d, 2, 1, 1), ep2);
  const double micro_batches = 2, moe_layers = 1, rows = 8.0 * m.seq * m.top_k;
  const double bytes = micro_batches * moe_layers * 4 /*exchanges*/ * 4 /*pack r+w, unpack r+w*/ * rows * m.hidden * 4.0;
  EXPECT_NEAR(p.ep_copies, bytes / d.mem_bw, 1e-9 * p.ep_copies);
  EXPECT_DOUBLE_EQ(ep_copy_bytes(1024, 2, 128, 4, 2), 16.0 * 1024 * 2 * 128 * 4);
  // In the step: the same layout without the copies is shorter by exactly them.
  Layout ep1 = ep2;
  ep1.ep = 1;
  EXPECT_EQ(predict(m, make_cluster(d, 2, 1, 1), ep1).ep_copies, 0.0);
  EXPECT_EQ(ep_copy_bytes(1024, 2, 128, 4, 1), 0.0);
}
