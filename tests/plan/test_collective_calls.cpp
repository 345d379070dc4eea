// The engine's own collective calls on a calibrated CPU (issue 16, item 4, session 11): sequence
// parallelism issues all-gathers and reduce-scatters, each one call with its own cost, which
// `atoll plan calibrate` now fits from the bench it already ran (plan/comm_fit.h fit_ring_phase)
// instead of pricing the pair as the all-reduce it replaces; and atoll's expert-parallel
// dispatcher all-gathers its row counts once per MoE layer and pads every chunk to one buffer
// size (parallel/expert_parallel.cpp). Each term is recomputed here from its formula, read back
// from a calibration file, and fails if dropped.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "plan/collective.h"
#include "plan/comm_fit.h"
#include "plan/predict.h"

using namespace atl::plan;

namespace {

Device calibrated_like() {
  Device d = find_device("a100-80gb");
  d.name = "cpu-local";
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

Layout tp2_sp() {
  Layout l;
  l.micro_batch = 8, l.global_batch = 8, l.precision = "fp32", l.tp = 2, l.sp = true;
  return l;
}

std::string write_calibration(const std::string& extra) {
  auto dir = std::filesystem::temp_directory_path() / "atoll_plan_collective_calls";
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

TEST(PlanRingPhaseFit, AllGatherAndReduceScatterFitTheirOwnRingLine) {
  // Two ranks: t = (n−1)·latency + (n−1)/n·bytes/bw = 80 µs + bytes / (2 · 1.2 GB/s); one
  // descheduled iteration per size, which the medians leave out.
  std::map<double, std::vector<double>> s;
  for (double bytes : {4096.0, 65536.0, 1048576.0, 16777216.0})
    s[bytes] = {80e-6 + bytes / 2.4e9, 80e-6 + bytes / 2.4e9, 5e-3};
  AlphaBetaFit f = fit_ring_phase(s, 2);
  EXPECT_NEAR(f.latency, 80e-6, 1e-9);
  EXPECT_NEAR(f.bandwidth, 1.2e9, 1e3);
  // The all-reduce's fit of the same line reads it as two phases of ⌈log₂ n⌉ steps: half the
  // latency, twice the bus bandwidth; the pair must not be priced by it.
  AlphaBetaFit a = fit_all_reduce(s, 2);
  EXPECT_NEAR(a.latency, 40e-6, 1e-9);
  // Times that do not grow with the size are refused, naming the collective.
  std::map<double, std::vector<double>> flat{{4096.0, {1e-4}}, {65536.0, {1e-4}}};
  try {
    fit_ring_phase(flat, 2);
    FAIL() << "a flat line was fitted";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("all-gather / reduce-scatter"), std::string::npos) << e.what();
  }
}

TEST(PlanSpPairs, SequenceParallelCallsTakeTheMeasuredAllGatherAndReduceScatter) {
  const ModelSpec m = small_gpt();
  Device d = calibrated_like(), plain = calibrated_like();
  d.ag_bw = 1.0e9, d.ag_latency = 90e-6, d.rs_bw = 0.8e9, d.rs_latency = 120e-6;
  const Layout l = tp2_sp();
  const Cluster c = make_cluster(d, 2, 1, 1), c0 = make_cluster(plain, 2, 1, 1);
  const Prediction p = predict(m, c, l), p0 = predict(m, c0, l);
  // Per micro-batch: 4 per layer, each an all-gather and a reduce-scatter of one [b, s, h] fp32
  // activation, every call (n−1) = 1 step of the ring moving half the buffer.
  const double io = 8.0 * 128 * 128 * 4, pair = io / 2 / 1.0e9 + 90e-6 + io / 2 / 0.8e9 + 120e-6;
  EXPECT_NEAR(p.tp.total(), 4.0 * m.layers * pair, 1e-12);
  // Without the fits: the all-reduce the pair replaces (bytes/bw + 2 latencies on 2 ranks).
  EXPECT_NEAR(p0.tp.total(), 4.0 * m.layers * (io / 1.6e9 + 2 * 60e-6), 1e-12);
  EXPECT_GT(p.step, p0.step);  // these fits are slower than half an all-reduce each
  // The embedding's and the head's pairs (control) move to the fits as well.
  EXPECT_GT(p.control.total(), p0.control.total());
  // Without sp the all-reduces stay all-reduces; an overridden link is not the calibrated one.
  Layout nosp = l;
  nosp.sp = false;
  EXPECT_DOUBLE_EQ(predict(m, c, nosp).tp.total(), predict(m, c0, nosp).tp.total());
  Cluster over = c;
  over.intra.latency = 10e-6;
  Cluster over0 = c0;
  over0.intra.latency = 10e-6;
  EXPECT_DOUBLE_EQ(predict(m, over, l).tp.total(), predict(m, over0, l).tp.total());
  // The wall-clock pass (sync_wait) takes the fits' wall figures: slower wall figures, more wait.
  Device dw = d;
  dw.ag_wall_bw = 0.5e9, dw.ag_wall_latency = 300e-6, dw.rs_wall_bw = 0.5e9, dw.rs_wall_latency = 300e-6;
  const Prediction pw = predict(m, make_cluster(dw, 2, 1, 1), l);
  EXPECT_NEAR(pw.tp.total(), p.tp.total(), 1e-15);  // the CPU-time links are unchanged
  EXPECT_GT(pw.sync_wait, p.sync_wait);
}

TEST(PlanSpPairs, CalibrationFileCarriesTheFits) {
  Device d = device_from_calibration(write_calibration(
      R"(,"intra_node_all_gather":{"bandwidth":1e9,"latency":9e-5,"wall_bandwidth":8e8,"wall_latency":2e-4},)"
      R"("intra_node_reduce_scatter":{"bandwidth":7e8,"latency":1.2e-4})"));
  EXPECT_DOUBLE_EQ(d.ag_bw, 1e9);
  EXPECT_DOUBLE_EQ(d.ag_latency, 9e-5);
  EXPECT_DOUBLE_EQ(d.ag_wall_bw, 8e8);
  EXPECT_DOUBLE_EQ(d.ag_wall_latency, 2e-4);
  EXPECT_DOUBLE_EQ(d.rs_bw, 7e8);
  EXPECT_DOUBLE_EQ(d.rs_wall_bw, 0.0);
  EXPECT_EQ(device_from_calibration(write_calibration("")).ag_bw, 0.0);
  try {
    device_from_calibration(write_calibration(R"(,"intra_node_reduce_scatter":{"bandwidth":-1,"latency":1e-4})"));
    FAIL() << "a negative bandwidth was read";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("intra_node_reduce_scatter"), std::string::npos) << e.what();
  }
  EXPECT_THROW(device_from_calibration(write_calibration(R"(,"intra_node_all_gather":{"bandwidth":1e9})")),
               atl::Error);
}

TEST(PlanEpExchange, AtollPadsEveryChunkAndAllGathersTheCountsPerLayer) {
  // moe-small's experts on the self-check's sizes (bench/plan_vs_measured_mp.sh).
  ModelSpec m = small_gpt();
  m.experts = 16, m.top_k = 2, m.expert_ffn = 64, m.shared_experts = 2, m.first_dense_layers = 1;
  Device d = calibrated_like();
  Layout l;
  l.micro_batch = 8, l.global_batch = 16, l.precision = "fp32", l.dp = 2, l.ep = 2, l.zero = 3;
  const Cluster c = make_cluster(d, 2, 1, 1);
  const Prediction p = predict(m, c, l);
  const double n_moe = double(m.layers - m.first_dense_layers);
  ASSERT_GT(n_moe, 0.0);
  // 4 exchanges per MoE layer of 1.5 × the routed rows (the dispatcher's grown buffers), half of
  // them to the peer; plus one all-gather of E int32 per rank (an AG of 4·E·ep bytes) per layer.
  const double routed = 8.0 * 128 * m.top_k * 128 * 4;
  const double a2a = 0.5 * 1.5 * routed / 1.6e9 + 60e-6;
  const double counts = 0.5 * 4.0 * m.experts * 2 / 1.6e9 + 60e-6;
  EXPECT_NEAR(p.ep.total(), n_moe * (4 * a2a + counts), 1e-12);
  // A catalogue GPU runs an engine that sends exact counts: no padding.
  Device gpu = find_device("a100-80gb");
  const Cluster cg = make_cluster(gpu, 2, 1, 1);
  const Prediction pg = predict(m, cg, l);
  const double g_a2a = 0.5 * routed / cg.intra.bw + cg.intra.latency;
  const double g_counts = 0.5 * 4.0 * m.experts * 2 / cg.intra.bw + cg.intra.latency;
  EXPECT_NEAR(pg.ep.total(), n_moe * (4 * g_a2a + g_counts), 1e-12);
  // The count exchange is a blocking point of its own besides the four exchanges.
  Device gw = d;
  gw.gap_wait_intercept = 30e-6, gw.gap_wait_slope = 0.04;
  EXPECT_DOUBLE_EQ(predict(m, make_cluster(gw, 2, 1, 1), l).gap_wait_points, 5.0 * n_moe);
}
