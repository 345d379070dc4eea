// Alpha-beta costs of hierarchical collectives (see collective.h).
#include "plan/collective.h"

#include <algorithm>
#include <cmath>

namespace atl::plan {

Level CommCost::top() const {
  int b = 0;
  for (int i = 1; i < 3; ++i)
    if (t[i] > t[b]) b = i;
  return Level(b);
}

namespace {
struct Span {
  int64_t k_node, n_nodes, k_island, n_islands;  // ranks per node, nodes per island, ...
};
Span span(const Cluster& c, Group g) {
  int64_t dpn = c.devices_per_node, dpi = c.devices_per_island();
  Span s;
  s.k_node = g.stride >= dpn ? 1 : std::min(g.size, std::max<int64_t>(1, dpn / g.stride));
  s.k_island = g.stride >= dpi ? 1 : std::min(g.size, std::max<int64_t>(1, dpi / g.stride));
  s.n_nodes = std::max<int64_t>(1, s.k_island / s.k_node);
  s.n_islands = std::max<int64_t>(1, g.size / s.k_island);
  return s;
}
double lg(int64_t n) { return n > 1 ? std::ceil(std::log2(double(n))) : 0; }
// Bandwidth term of one ring phase (reduce-scatter or all-gather) over n ranks of per-rank
// bandwidth bw.
double phase_bw(int64_t n, double bytes, const Link& l) { return n > 1 ? double(n - 1) / n * bytes / l.bw : 0; }
// One phase of a tree-capable all-reduce: ⌈log₂ n⌉ latencies (NCCL picks a tree for small messages).
double phase(int64_t n, double bytes, const Link& l) { return n > 1 ? phase_bw(n, bytes, l) + lg(n) * l.latency : 0; }
// The wide-area link is shared by the whole island: every one of its devices pushes its own
// share (bytes, already divided by the k_island ranks of its group inside the island) at once.
double wan_phase(const Cluster& c, const Span& s, double bytes, bool ring = false) {
  if (s.n_islands <= 1) return 0;
  double senders = double(c.devices_per_island());
  double steps = ring ? double(s.n_islands - 1) : lg(s.n_islands);
  return double(s.n_islands - 1) / s.n_islands * bytes * senders / c.wan.bw + steps * c.wan.latency;
}
}  // namespace

Level group_level(const Cluster& c, Group g) {
  Span s = span(c, g);
  if (s.n_islands > 1) return Level::inter_island;
  if (s.n_nodes > 1) return Level::inter_node;
  return Level::intra_node;
}

// Reduce-scatter and all-gather run as one flat ring over all g.size ranks (NCCL has no tree for
// them): g.size − 1 steps, each waiting for the slowest hop it crosses. A chunk's path around the
// ring crosses n_nodes − 1 node boundaries per island and stays on NVLink for the other steps, so
// the latency is (size − n_nodes·n_islands)·α_intra + (n_nodes − 1)·n_islands·α_inter +
// (n_islands − 1)·α_wan: NCCL's own ring model (baseLat + nInterSteps·interLat + the other steps
// ·intraLat, src/graph/tuning.cc; restated in torch/_inductor/comm_analysis.py). Bandwidth as in
// the hierarchical split: each NIC carries its rank's 1/k_node of the inter-node traffic.
CommCost reduce_scatter(const Cluster& c, Group g, double bytes) {
  CommCost r;
  if (g.size <= 1 || bytes <= 0) return r;
  Span s = span(c, g);
  const double nodes = double(s.n_nodes * s.n_islands);
  r.t[0] = phase_bw(s.k_node, bytes, c.intra) + (double(g.size) - nodes) * c.intra.latency;
  r.t[1] = phase_bw(s.n_nodes, bytes / s.k_node, c.inter) + double(s.n_nodes - 1) * s.n_islands * c.inter.latency;
  r.t[2] = wan_phase(c, s, bytes / s.k_island, true);
  return r;
}
CommCost all_gather(const Cluster& c, Group g, double bytes) { return reduce_scatter(c, g, bytes); }
CommCost all_reduce(const Cluster& c, Group g, double bytes) {
  CommCost r;
  if (g.size <= 1 || bytes <= 0) return r;
  Span s = span(c, g);
  r.t[0] = 2 * phase(s.k_node, bytes, c.intra);
  r.t[1] = 2 * phase(s.n_nodes, bytes / s.k_node, c.inter);
  r.t[2] = 2 * wan_phase(c, s, bytes / s.k_island);
  return r;
}

CommCost all_to_all(const Cluster& c, Group g, double bytes) {
  CommCost r;
  if (g.size <= 1 || bytes <= 0) return r;
  Span s = span(c, g);
  double n = double(g.size);
  // Of each rank's bytes, (k_node-1)/n stay in the node, the rest of the island crosses NICs,
  // the rest of the group crosses islands.
  r.t[0] = (s.k_node - 1) / n * bytes / c.intra.bw + (s.k_node > 1 ? c.intra.latency * (s.k_node - 1) : 0);
  r.t[1] = (s.k_island - s.k_node) / n * bytes / c.inter.bw + (s.n_nodes > 1 ? c.inter.latency * (s.n_nodes - 1) : 0);
  if (s.n_islands > 1)
    r.t[2] = (n - s.k_island) / n * bytes * c.devices_per_island() / c.wan.bw + c.wan.latency * (s.n_islands - 1);
  return r;
}

namespace {
bool phase_fits_apply(const Cluster& c, Group g) {
  const Device& d = c.device;
  return d.ag_bw > 0 && d.rs_bw > 0 && c.intra.bw == d.intra_bw && c.intra.latency == d.intra_latency &&
         group_level(c, g) == Level::intra_node;
}
}  // namespace

CommCost ring_phase(const Cluster& c, Group g, double bytes, bool gather, bool* measured) {
  const bool fit = g.size > 1 && bytes > 0 && phase_fits_apply(c, g);
  if (measured) *measured = fit;
  if (!fit) return gather ? all_gather(c, g, bytes) : reduce_scatter(c, g, bytes);
  // (n−1) steps of the ring inside the node, each one call's latency, (n−1)/n of the buffer moved.
  const Device& d = c.device;
  const double n = double(g.size), bw = gather ? d.ag_bw : d.rs_bw, lat = gather ? d.ag_latency : d.rs_latency;
  CommCost r;
  r.t[0] = (n - 1) / n * bytes / bw + (n - 1) * lat;
  return r;
}

CommCost sp_pair(const Cluster& c, Group g, double bytes, bool* measured) {
  if (!(g.size > 1 && bytes > 0 && phase_fits_apply(c, g))) {
    if (measured) *measured = false;
    return all_reduce(c, g, bytes);
  }
  CommCost r = ring_phase(c, g, bytes, true, measured);
  r += ring_phase(c, g, bytes, false);
  return r;
}

CommCost send_recv(const Cluster& c, Group g, double bytes) {
  CommCost r;
  if (bytes <= 0 || g.size <= 1) return r;
  // A pipeline runs at the pace of its slowest stage-to-stage link. Over a node's NIC every rank
  // of the stage sends on its own link; over the wide-area link all of them share it.
  switch (group_level(c, g)) {
    case Level::intra_node: r.t[0] = bytes / c.intra.bw + c.intra.latency; break;
    case Level::inter_node: r.t[1] = bytes / c.inter.bw + c.inter.latency; break;
    case Level::inter_island:
      r.t[2] = bytes * double(std::min(g.stride, c.devices_per_island())) / c.wan.bw + c.wan.latency;
      break;
  }
  return r;
}

}  // namespace atl::plan
