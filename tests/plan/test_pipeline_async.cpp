// Asynchronous pipeline sends (overlap_pp; Llama 3, Dubey et al. 2024 §3.3.2: "we adopt
// asynchronous point-to-point communication in PP"): each send runs beside the next model chunk's
// forward, so only what outlasts it is exposed, and the hidden part costs the SMs it holds.
#include <gtest/gtest.h>

#include "plan/predict.h"

using namespace atl::plan;

namespace {
// Llama 3 405B at 8K tokens as Table 4 runs it: TP 8, PP 16 of 8 one-layer chunks, DP 64.
Layout llama3_layout() {
  Layout l;
  l.tp = 8, l.pp = 16, l.dp = 64, l.schedule = "interleaved", l.virtual_stages = 8;
  l.sp = true, l.zero = 1, l.micro_batch = 1, l.global_batch = 2048, l.precision = "bf16";
  return l;
}
ModelSpec llama3_8k() {
  ModelSpec m = model_preset("llama3-405b");
  m.seq = 8192;
  return m;
}
}  // namespace

TEST(PlanPipelineAsync, SendsThatFitBesideAChunkCostOnlyTheirSmShare) {
  const ModelSpec m = llama3_8k();
  const Cluster c = make_cluster(find_device("h100-sxm"), 8, 1024, 1);
  Layout l = llama3_layout();
  const Prediction blocking = predict(m, c, l);
  l.overlap_pp = true;
  const Prediction async = predict(m, c, l);
  // 2·v·(m + p − 1) sends of 33.5 MB at ~40 GB/s (~0.8 ms each) beside one-layer forwards of
  // ~10 ms: every send hides, so the charge is the 20/132 SM share of the blocking time.
  EXPECT_GT(blocking.pp_p2p.total(), 0);
  EXPECT_NEAR(async.pp_p2p.total(), blocking.pp_p2p.total() * 20.0 / 132.0, 1e-9 * blocking.pp_p2p.total());
  EXPECT_NEAR(blocking.step - async.step, blocking.pp_p2p.total() * (1 - 20.0 / 132.0), 1e-6 * blocking.step);
  EXPECT_GT(async.mfu, blocking.mfu);
  // --explain says the sends are asynchronous.
  PredictOptions ex;
  ex.explain = true;
  bool said = false;
  for (auto& f : predict(m, c, l, ex).figures)
    if (f.key == "time.pp_p2p") said = f.formula.find("overlap_pp") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(PlanPipelineAsync, SendsThatOutlastAChunkStayPartlyExposed) {
  const ModelSpec m = llama3_8k();
  Cluster c = make_cluster(find_device("h100-sxm"), 8, 1024, 1);
  c.inter.bw = 0.5e9;  // a slow NIC: one 33.5 MB send takes ~67 ms, several chunk forwards
  Layout l = llama3_layout();
  const Prediction blocking = predict(m, c, l);
  l.overlap_pp = true;
  const Prediction async = predict(m, c, l);
  EXPECT_LT(async.pp_p2p.total(), blocking.pp_p2p.total());
  EXPECT_GT(async.pp_p2p.total(), 0.5 * blocking.pp_p2p.total());  // most of each send is exposed
}
