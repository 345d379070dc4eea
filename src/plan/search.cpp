// Exhaustive layout search. The space is small enough to enumerate (degrees are divisors of
// the world size), and one prediction costs microseconds, so there is no need for pruning
// heuristics that could miss the best layout.
#include "plan/search.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace atl::plan {

static std::vector<int64_t> divisors(int64_t n, int64_t cap) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n && i <= cap; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::vector<Candidate> pareto_frontier(std::vector<Candidate> v) {
  std::sort(v.begin(), v.end(), [](const Candidate& a, const Candidate& b) {
    return a.train_seconds != b.train_seconds ? a.train_seconds < b.train_seconds : a.train_cost < b.train_cost;
  });
  std::vector<Candidate> out;
  double best_cost = INFINITY;
  for (auto& c : v) {
    if (c.oom) continue;
    if (c.train_cost < best_cost * (1 - 1e-9)) {
      out.push_back(c);
      best_cost = c.train_cost;
    }
  }
  return out;
}

SearchResult search_layouts(const ModelSpec& m, const Cluster& full, const SearchOptions& o) {
  SearchResult r;
  std::vector<std::pair<int64_t, int64_t>> shapes;  // (nodes_per_island, islands)
  if (o.vary_cluster) {
    for (int64_t isl = 1; isl <= full.islands; ++isl)
      for (int64_t n = 1; n <= full.nodes_per_island; n *= 2) shapes.push_back({n, isl});
    if ((full.nodes_per_island & (full.nodes_per_island - 1)) != 0)
      for (int64_t isl = 1; isl <= full.islands; ++isl) shapes.push_back({full.nodes_per_island, isl});
  } else {
    shapes.push_back({full.nodes_per_island, full.islands});
  }
  const bool decentral = o.decentral.diloco_h > 0 || o.decentral.gossip_peers > 0;
  PredictOptions po;
  po.train_tokens = o.train_tokens;
  for (auto [npi, isl] : shapes) {
    Cluster c = full;
    c.nodes_per_island = npi, c.islands = isl;
    c.island_names.resize(isl), c.island_price.resize(isl);
    if (decentral && isl < 2) continue;
    const int64_t world = c.world();
    // A fixed global batch must divide evenly; a batch given in tokens is rounded to the nearest
    // multiple of dp × micro_batch, as one would when choosing it for that layout.
    const double want = std::max(1.0, o.batch_tokens / m.seq);
    for (int64_t tp : divisors(world, std::min<int64_t>(m.heads, 2 * c.devices_per_node))) {
      for (int64_t pp : divisors(world / tp, m.layers)) {
        for (int64_t cp : divisors(world / (tp * pp), 8)) {
          const int64_t dp = world / (tp * pp * cp);
          std::vector<int64_t> eps = {1};
          if (m.is_moe())
            for (int64_t e = 2; e <= m.experts && e <= dp * cp; e *= 2) eps.push_back(e);
          for (int64_t ep : eps)
            for (int zero : o.zero_stages)
              for (int64_t mb : o.micro_batches)
                for (const auto& rc : o.recomputes)
                  for (int sched = 0; sched < (pp > 1 ? 2 : 1); ++sched)
                    for (int sp = 0; sp < (tp > 1 ? 2 : 1); ++sp) {
                      Layout l = o.decentral;
                      l.dp = dp, l.tp = tp, l.pp = pp, l.cp = cp, l.ep = ep, l.zero = zero;
                      const int64_t unit = dp * mb;
                      const int64_t gb = o.global_batch > 0
                                             ? o.global_batch
                                             : unit * std::max<int64_t>(1, std::llround(want / double(unit)));
                      l.micro_batch = mb, l.global_batch = gb, l.recompute = rc, l.sp = sp;
                      l.schedule = sched ? "interleaved" : "1f1b";
                      l.virtual_stages = sched ? 2 : 1;
                      l.precision = o.precision, l.optimizer = o.optimizer;
                      Prediction p;
                      try {
                        p = predict(m, c, l, po);
                      } catch (const Error&) {
                        ++r.rejected;
                        continue;
                      }
                      ++r.evaluated;
                      Candidate k{l, npi, isl, p.step, p.tokens_per_s, p.mfu, p.train_seconds, p.train_cost,
                                  p.memory.total, p.memory.margin, p.memory.oom, p.bottleneck};
                      if (!k.oom) ++r.fits;
                      r.all.push_back(std::move(k));
                    }
        }
      }
    }
  }
  for (auto& k : r.all)
    if (!k.oom) r.ranked.push_back(k);
  if (o.objective == "cost")
    std::sort(r.ranked.begin(), r.ranked.end(),
              [](const Candidate& a, const Candidate& b) { return a.train_cost < b.train_cost; });
  else
    std::sort(r.ranked.begin(), r.ranked.end(),
              [](const Candidate& a, const Candidate& b) { return a.tokens_per_s > b.tokens_per_s; });
  r.pareto = pareto_frontier(r.ranked);
  return r;
}

}  // namespace atl::plan
