// Parameter sweeps. At every point the layout keeps its model-parallel degrees and the data-
// parallel degree absorbs the change in devices (or, with `best`, the search picks the layout).
#include "plan/sweep.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/config.h"
#include "core/error.h"

namespace atl::plan {

std::vector<std::string> sweep_params() { return {"island_size", "islands", "batch", "bandwidth", "wan_bandwidth"}; }

static std::string regime_of(const std::string& bottleneck) {
  auto dash = bottleneck.find(" — ");
  return dash == std::string::npos ? bottleneck : bottleneck.substr(0, dash);
}

std::vector<SweepPoint> run_sweep(const ModelSpec& m, const Cluster& base, const Layout& l0, const SweepOptions& o) {
  auto ps = sweep_params();
  if (std::find(ps.begin(), ps.end(), o.param) == ps.end()) {
    std::string list;
    for (auto& p : ps) list += (list.empty() ? "" : ", ") + p;
    fail("unknown sweep parameter '{}'; known: {} (did you mean '{}'?)", o.param, list, nearest(o.param, ps));
  }
  ATOLL_CHECK(!o.values.empty(), "sweep over '{}' needs at least one value", o.param);
  std::vector<SweepPoint> out;
  PredictOptions po;
  po.train_tokens = o.train_tokens;
  for (double v : o.values) {
    SweepPoint pt;
    pt.value = v;
    Cluster c = base;
    Layout l = l0;
    try {
      ATOLL_CHECK(v > 0, "sweep value {} must be positive", v);
      if (o.param == "island_size") c.nodes_per_island = int64_t(std::llround(v));
      else if (o.param == "islands") c.islands = int64_t(std::llround(v));
      else if (o.param == "batch") l.global_batch = int64_t(std::llround(v));
      else if (o.param == "bandwidth") c.inter.bw = v * 1e9;
      else if (o.param == "wan_bandwidth") c.wan.bw = v * 1e9;
      c.island_names.resize(c.islands, "island");
      c.island_price.resize(c.islands, base.island_price.empty() ? c.device.price_hour : base.island_price[0]);
      int64_t mp = l.tp * l.pp * l.cp;
      ATOLL_CHECK(c.world() % mp == 0, "{} devices are not a multiple of tp×pp×cp = {}", c.world(), mp);
      l.dp = c.world() / mp;
      if (o.best) {
        SearchOptions so = o.search;
        so.vary_cluster = false;
        so.train_tokens = o.train_tokens;
        if (o.param == "batch") so.global_batch = l.global_batch;
        so.decentral = l;
        SearchResult r = search_layouts(m, c, so);
        ATOLL_CHECK(!r.ranked.empty(), "no layout fits in memory at this point");
        l = r.ranked.front().layout;
      }
      pt.p = predict(m, c, l, po);
      pt.valid = true;
    } catch (const Error& e) {
      pt.error = e.what();
    }
    pt.layout = l;
    pt.devices = c.world();
    if (pt.valid) {
      double comm = pt.p.comm_total().total();
      pt.comm_fraction = comm / pt.p.step;
      pt.compute_fraction = pt.p.compute / pt.p.step;
      pt.bubble_fraction = pt.p.bubble / pt.p.step;
      pt.regime = regime_of(pt.p.bottleneck);
    }
    out.push_back(std::move(pt));
  }
  return out;
}

Plot sweep_plot(const std::vector<SweepPoint>& pts, const SweepOptions& o, const std::string& title) {
  Plot p;
  p.title = title;
  static const std::map<std::string, std::string> xl = {
      {"island_size", "nodes per island"}, {"islands", "islands"}, {"batch", "global batch (sequences)"},
      {"bandwidth", "inter-node bandwidth (GB/s per device)"}, {"wan_bandwidth", "inter-island bandwidth (GB/s)"}};
  p.xlabel = xl.at(o.param);
  p.ylabel = "tokens/s per device";
  p.y2label = "share of step time (%)";
  Series thr{"tokens/s per device", {}, {}, "#1f77b4"};
  Series comm{"communication share (%)", {}, {}, "#d62728"};
  comm.right_axis = true;
  Series comp{"GEMM compute share (%)", {}, {}, "#2ca02c"};
  comp.right_axis = true;
  double lo = INFINITY, hi = 0;
  std::string prev;
  for (auto& pt : pts) {
    if (!pt.valid) continue;
    lo = std::min(lo, pt.value), hi = std::max(hi, pt.value);
    thr.x.push_back(pt.value), thr.y.push_back(pt.p.tokens_per_s_device);
    comm.x.push_back(pt.value), comm.y.push_back(100 * pt.comm_fraction);
    comp.x.push_back(pt.value), comp.y.push_back(100 * pt.compute_fraction);
    if (!prev.empty() && pt.regime != prev) p.vlines.push_back({pt.value, "→ " + pt.regime});
    prev = pt.regime;
  }
  p.logx = hi > 0 && lo > 0 && hi / lo >= 8;
  p.series = {thr, comm, comp};
  return p;
}

}  // namespace atl::plan
