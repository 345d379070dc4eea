// Behaviour of the step-time model: each mechanism moves the prediction the way its formula
// says, and every figure can be explained.
#include <gtest/gtest.h>

#include <cmath>

#include "plan/predict.h"

using namespace atl::plan;

namespace {
Cluster h100(int64_t nodes, int64_t islands = 1) { return make_cluster(find_device("h100-sxm"), 8, nodes, islands); }
}  // namespace

TEST(PlanPredict, StepTimeIsTheSumOfItsParts) {
  ModelSpec m = model_preset("llama2-13b");
  Layout l;
  l.tp = 4, l.pp = 2, l.dp = 4, l.global_batch = 64, l.zero = 1, l.recompute = "selective";
  Prediction p = predict(m, h100(4), l);
  double parts = p.compute + p.memory_bound + p.grad_buffers + p.fsdp_copies + p.tp.total() + p.cp.total() + p.ep.total() + p.bubble +
                 p.pp_p2p.total() + p.dp.total() + p.optimizer + p.offload + p.outer.total() + p.control.total();
  EXPECT_NEAR(parts / p.step, 1.0, 1e-9);
  EXPECT_NEAR(p.tokens_per_s, 64.0 * m.seq / p.step, 1e-6 * p.tokens_per_s);
  EXPECT_NEAR(p.tokens_per_s_device * 32, p.tokens_per_s, 1e-6 * p.tokens_per_s);
  EXPECT_GT(p.mfu, 0.05);
  EXPECT_LT(p.mfu, 0.85);
  EXPECT_LT(p.mfu, p.hfu);  // recompute adds hardware FLOPs
  EXPECT_NEAR(p.train_cost, p.train_seconds / 3600 * 32 * 2.9, 1e-6 * p.train_cost);
  // The bubble is (p-1)/m of the pipelined work: 1 / 16 micro-batches. The parameter gradients
  // are zeroed once per step, outside the pipeline.
  // Gradient accumulation of the 15 micro-batches after the first (3 × gradient bytes each) also
  // runs outside the pipeline's slots.
  double param_zero = p.memory.grads / h100(4).device.mem_bw;
  double accum = 15 * 3 * p.memory.grads / h100(4).device.mem_bw;
  EXPECT_GT(p.grad_buffers, param_zero + accum);
  // The step's small collectives of each micro-batch (tp's embedding/head ends) run in its slot too.
  const double control_mb = 16 * step_protocol_collectives(m, h100(4), l).per_micro_batch.total();
  EXPECT_GT(control_mb, 0);
  EXPECT_NEAR(p.bubble / (p.compute + p.memory_bound + p.grad_buffers - param_zero - accum + p.tp.total() + control_mb),
              1.0 / 16, 1e-9);
}

TEST(PlanPredict, InterleavingShrinksTheBubbleByV) {
  ModelSpec m = model_preset("llama2-70b");
  Layout l;
  l.tp = 8, l.pp = 8, l.dp = 1, l.global_batch = 16, l.zero = 1;
  Prediction a = predict(m, h100(8), l);
  l.schedule = "interleaved", l.virtual_stages = 2;
  Prediction b = predict(m, h100(8), l);
  EXPECT_NEAR(b.bubble / a.bubble, 0.5, 1e-9);
  EXPECT_GT(b.pp_p2p.total(), a.pp_p2p.total());  // but sends v times as much
}

TEST(PlanPredict, RecomputeTradesTimeForMemory) {
  ModelSpec m = model_preset("llama2-7b");
  Layout l;
  l.dp = 8, l.zero = 3, l.global_batch = 64, l.micro_batch = 2;
  Prediction none = predict(m, h100(1), l);
  l.recompute = "selective";
  Prediction sel = predict(m, h100(1), l);
  l.recompute = "full";
  Prediction full = predict(m, h100(1), l);
  EXPECT_LT(none.step, sel.step);
  EXPECT_LT(sel.step, full.step);
  EXPECT_GE(none.memory.activations, sel.memory.activations);
  EXPECT_GT(sel.memory.activations, full.memory.activations);
  // Full recompute repeats the layer forward: about 4/3 of the compute of no recompute.
  EXPECT_NEAR(full.compute / none.compute, 4.0 / 3, 0.05);
}

TEST(PlanPredict, SlowerInterconnectExposesMoreDataParallelTime) {
  ModelSpec m = model_preset("gpt2-1.5b");
  Layout l;
  l.dp = 32, l.global_batch = 256, l.overlap_dp = false;
  Cluster fast = h100(4), slow = h100(4);
  slow.inter.bw /= 10;
  Prediction a = predict(m, fast, l), b = predict(m, slow, l);
  EXPECT_GT(b.dp.t[1], 5 * a.dp.t[1]);
  EXPECT_DOUBLE_EQ(a.dp.t[2], 0.0);  // one island: nothing crosses the wide area
  EXPECT_NEAR(a.compute, b.compute, 1e-12);
}

TEST(PlanPredict, DilocoAmortisesTheWideAreaSync) {
  ModelSpec m = model_preset("llama3-8b");
  Cluster c = h100(2, 4);  // 4 islands of 16 devices, 10 Gb/s between them
  Layout l;
  l.dp = 64, l.zero = 1, l.global_batch = 256;
  Prediction ddp = predict(m, c, l);  // plain data parallelism across islands
  l.diloco_h = 100;
  Prediction dl = predict(m, c, l);
  l.diloco_compression = 0.25;
  Prediction dlc = predict(m, c, l);
  l.diloco_h = 0, l.gossip_peers = 1;
  Prediction gossip = predict(m, c, l);
  EXPECT_GT(ddp.dp.t[2], 0.0);
  EXPECT_DOUBLE_EQ(dl.dp.t[2], 0.0);  // inner steps stay inside the island
  EXPECT_GT(dl.outer.t[2], 0.0);
  EXPECT_LT(dl.step, ddp.step);
  EXPECT_NEAR(dlc.outer.t[2] / dl.outer.t[2], 0.25, 0.01);
  EXPECT_GT(gossip.outer.t[2], 0.0);
  EXPECT_NE(ddp.bottleneck.find("inter-island"), std::string::npos) << ddp.bottleneck;
}

TEST(PlanPredict, MoeWithExpertParallelismHasAllToAll) {
  ModelSpec m = model_preset("deepseek-v3");
  Cluster c = make_cluster(find_device("h200"), 8, 32, 1);
  Layout l;
  l.pp = 16, l.ep = 16, l.dp = 16, l.zero = 1, l.global_batch = 1024;
  Prediction p = predict(m, c, l);
  EXPECT_GT(p.ep.total(), 0.0);
  EXPECT_GT(p.mfu, 0.05);
  EXPECT_LT(p.mfu, 0.8);
  // MFU counts the ~37B active parameters (plus attention), not all 671B.
  EXPECT_GT(p.model_flops_per_token, 6.0 * 37e9);
  EXPECT_LT(p.model_flops_per_token, 0.1 * 6.0 * double(m.total_params()));
}

TEST(PlanPredict, OutOfMemoryIsFlaggedWithNegativeMargin) {
  ModelSpec m = model_preset("llama2-70b");
  Layout l;
  l.dp = 8;
  Prediction p = predict(m, h100(1), l);
  EXPECT_TRUE(p.memory.oom);
  EXPECT_LT(p.memory.margin, 0);
  EXPECT_GT(p.memory.total, 8 * 70e9);  // 16 bytes per parameter without sharding
}

TEST(PlanPredict, ExplainGivesEveryFigureAFormula) {
  ModelSpec m = model_preset("gpt2-124m");
  Layout l;
  l.dp = 8;
  PredictOptions o;
  o.explain = true;
  Prediction p = predict(m, h100(1), l, o);
  ASSERT_GE(p.figures.size(), 25u);
  bool saw_mfu = false;
  for (auto& f : p.figures) {
    EXPECT_FALSE(f.formula.empty()) << f.key;
    EXPECT_TRUE(std::isfinite(f.value)) << f.key;
    if (f.key == "utilization.mfu") {
      saw_mfu = true;
      EXPECT_DOUBLE_EQ(f.value, p.mfu);
    }
  }
  EXPECT_TRUE(saw_mfu);
  EXPECT_TRUE(predict(m, h100(1), l).figures.empty());  // not explaining: nothing recorded
}

TEST(PlanPredict, PredictionIsAPureFunctionOfItsInputs) {
  // Search and sweep call predict() thousands of times and compare the results, so the same
  // inputs must give bit-identical figures (its speed is reported by `plan search`, not tested:
  // no timing assertions in unit tests).
  ModelSpec m = model_preset("llama3-70b");
  Layout l;
  l.tp = 8, l.pp = 4, l.dp = 4, l.zero = 1, l.global_batch = 256, l.recompute = "selective";
  Cluster c = h100(16);
  Prediction first = predict(m, c, l);
  EXPECT_GT(first.step, 0);
  for (int i = 0; i < 100; ++i) {
    Prediction again = predict(m, c, l);
    ASSERT_EQ(again.step, first.step);
    ASSERT_EQ(again.grad_buffers, first.grad_buffers);
    ASSERT_EQ(again.memory.total, first.memory.total);
  }
}
