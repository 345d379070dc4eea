// Layout search, Pareto frontier, sweeps and the SVG plots.
#include <gtest/gtest.h>

#include <set>

#include "plan/report.h"
#include "plan/search.h"
#include "plan/sweep.h"
#include "plan/svg_plot.h"
#include "core/error.h"

using namespace atl::plan;

TEST(PlanSearch, EnumeratesTenThousandLayoutsAndRanksOnlyFittingOnes) {
  ModelSpec m = model_preset("llama3-8b");
  Cluster c = make_cluster(find_device("h100-sxm"), 8, 8, 2);
  SearchOptions o;
  SearchResult r = search_layouts(m, c, o);
  EXPECT_GE(r.evaluated, 10000);
  ASSERT_FALSE(r.ranked.empty());
  for (size_t i = 1; i < r.ranked.size(); ++i) EXPECT_GE(r.ranked[i - 1].tokens_per_s, r.ranked[i].tokens_per_s);
  for (auto& k : r.ranked) EXPECT_FALSE(k.oom);
  EXPECT_EQ(int64_t(r.ranked.size()), r.fits);
  // The best is re-predictable and really is the fastest fitting candidate.
  const Candidate& best = r.ranked.front();
  Cluster bc = c;
  bc.nodes_per_island = best.nodes_per_island, bc.islands = best.islands;
  bc.island_price.resize(best.islands);
  Prediction p = predict(m, bc, best.layout);
  EXPECT_NEAR(p.tokens_per_s, best.tokens_per_s, 1e-9 * p.tokens_per_s);
  for (auto& k : r.all) {
    if (k.oom) continue;
    EXPECT_LE(k.tokens_per_s, best.tokens_per_s * (1 + 1e-12));
  }
}

TEST(PlanSearch, ParetoFrontierIsNonDominatedAndSorted) {
  ModelSpec m = model_preset("gpt2-1.5b");
  Cluster c = make_cluster(find_device("a100-80gb"), 8, 4, 1);
  c.inter.bw = 1.25e9 / 8;  // one 10 Gb/s NIC per 8-GPU node: more nodes are faster but cost more
  SearchOptions o;
  o.batch_tokens = 1 << 20;
  SearchResult r = search_layouts(m, c, o);
  ASSERT_GE(r.pareto.size(), 2u);  // one to four nodes: faster costs more
  for (size_t i = 1; i < r.pareto.size(); ++i) {
    EXPECT_GT(r.pareto[i].train_seconds, r.pareto[i - 1].train_seconds);
    EXPECT_LT(r.pareto[i].train_cost, r.pareto[i - 1].train_cost);
  }
  for (auto& k : r.ranked)
    for (auto& f : r.pareto)
      EXPECT_FALSE(k.train_seconds < f.train_seconds * (1 - 1e-12) && k.train_cost < f.train_cost * (1 - 1e-12))
          << k.layout.describe() << " dominates " << f.layout.describe();
  std::string csv = pareto_csv(r.pareto);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), long(r.pareto.size() + 1));
  std::string svg = render_svg(pareto_plot(r, "t"));
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("<polyline"), std::string::npos);
}

TEST(PlanSearch, CostObjectiveRanksByCost) {
  ModelSpec m = model_preset("gpt2-355m");
  Cluster c = make_cluster(find_device("rtx4090"), 4, 4, 1);
  SearchOptions o;
  o.objective = "cost";
  o.batch_tokens = 1 << 19;
  SearchResult r = search_layouts(m, c, o);
  ASSERT_GE(r.ranked.size(), 2u);
  for (size_t i = 1; i < r.ranked.size(); ++i) EXPECT_LE(r.ranked[i - 1].train_cost, r.ranked[i].train_cost);
}

TEST(PlanSweep, IslandsSweepTurnsCommunicationBound) {
  ModelSpec m = model_preset("llama3-8b");
  Cluster c = make_cluster(find_device("h100-sxm"), 8, 2, 1);
  Layout l;
  l.tp = 1, l.zero = 1, l.micro_batch = 1;  // dp follows the device count, batch = dp × 1
  SweepOptions o;
  o.param = "islands";
  o.values = {1, 2, 4, 8};
  auto pts = run_sweep(m, c, l, o);
  ASSERT_EQ(pts.size(), 4u);
  for (auto& p : pts) ASSERT_TRUE(p.valid) << p.error;
  EXPECT_EQ(pts[0].devices, 16);
  EXPECT_EQ(pts[3].devices, 128);
  EXPECT_DOUBLE_EQ(pts[0].p.comm_total().t[2], 0.0);
  // Per-device throughput falls once gradients cross the 10 Gb/s wide-area link.
  EXPECT_LT(pts[1].p.tokens_per_s_device, 0.5 * pts[0].p.tokens_per_s_device);
  EXPECT_GT(pts[3].comm_fraction, pts[0].comm_fraction);
  EXPECT_EQ(pts[0].regime.rfind("compute-bound", 0), 0u) << pts[0].regime;
  EXPECT_NE(pts[3].regime.find("inter-island"), std::string::npos) << pts[3].regime;
  Plot plot = sweep_plot(pts, o, "islands");
  EXPECT_FALSE(plot.vlines.empty());  // the transition is marked
  EXPECT_NE(render_svg(plot).find("inter-island"), std::string::npos);
  std::string table = format_sweep(pts, o);
  EXPECT_NE(table.find("communication-bound"), std::string::npos);
}

TEST(PlanSweep, InvalidPointsCarryTheirConstraintAndUnknownParamsAreNamed) {
  ModelSpec m = model_preset("gpt2-124m");
  Cluster c = make_cluster(find_device("a100-80gb"), 8, 1, 1);
  Layout l;
  l.tp = 4, l.global_batch = 64;
  SweepOptions o;
  o.param = "batch";
  o.values = {64, 63};
  auto pts = run_sweep(m, c, l, o);
  EXPECT_TRUE(pts[0].valid) << pts[0].error;
  EXPECT_FALSE(pts[1].valid);
  EXPECT_NE(pts[1].error.find("multiple of dp"), std::string::npos) << pts[1].error;
  o.param = "bandwith";
  try {
    run_sweep(m, c, l, o);
    FAIL();
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bandwidth"), std::string::npos) << e.what();
  }
}

TEST(PlanSweep, BestModePicksTheSearchWinnerAtEveryPoint) {
  ModelSpec m = model_preset("gpt2-774m");
  Cluster c = make_cluster(find_device("a100-40gb"), 8, 1, 1);
  Layout l;
  SweepOptions o;
  o.param = "island_size";
  o.values = {1, 2};
  o.best = true;
  o.search.micro_batches = {1, 2};
  auto pts = run_sweep(m, c, l, o);
  ASSERT_EQ(pts.size(), 2u);
  for (auto& pt : pts) {
    ASSERT_TRUE(pt.valid) << pt.error;
    Cluster cc = c;
    cc.nodes_per_island = int64_t(pt.value);
    SearchOptions so = o.search;
    so.vary_cluster = false;
    so.decentral = Layout{};
    SearchResult r = search_layouts(m, cc, so);
    ASSERT_FALSE(r.ranked.empty());
    EXPECT_NEAR(pt.p.tokens_per_s, r.ranked.front().tokens_per_s, 1e-9 * pt.p.tokens_per_s);
    EXPECT_FALSE(pt.p.memory.oom);
  }
  EXPECT_EQ(pts[1].devices, 16);
}
