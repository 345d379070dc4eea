// Cost of collectives on a hierarchical topology, split by level. Rings and trees follow the
// usual alpha-beta model (Thakur, Rabenseifner & Gropp 2005): an all-reduce of B bytes over g
// ranks moves 2(g-1)/g·B per rank. Groups that span levels run hierarchically: reduce-scatter
// inside the node, all-reduce of 1/k of the data across nodes (every rank's NIC in parallel),
// then across islands over the shared wide-area link.
//
// On cpu-local the intra-node link's bandwidth and latency are the ones `atoll plan calibrate`
// fitted to all-reduces between 2 local ranks (Device::links_measured, not derated).
#pragma once
#include <cstdint>

#include "plan/cluster.h"

namespace atl::plan {

struct CommCost {
  double t[3] = {0, 0, 0};  // seconds per Level
  double total() const { return t[0] + t[1] + t[2]; }
  Level top() const;  // the slowest level
  CommCost& operator+=(const CommCost& o) {
    for (int i = 0; i < 3; ++i) t[i] += o.t[i];
    return *this;
  }
  CommCost scaled(double s) const {
    CommCost c = *this;
    for (double& x : c.t) x *= s;
    return c;
  }
};

// A group of `size` ranks whose consecutive members are `stride` ranks apart.
struct Group {
  int64_t stride = 1, size = 1;
};

CommCost all_reduce(const Cluster& c, Group g, double bytes);
CommCost reduce_scatter(const Cluster& c, Group g, double bytes);  // bytes: the full buffer
CommCost all_gather(const Cluster& c, Group g, double bytes);      // bytes: the full buffer
CommCost all_to_all(const Cluster& c, Group g, double bytes);      // bytes: sent by each rank
// One point-to-point transfer between neighbours of group g (pipeline stages: stride = ranks per
// stage, size = pp), timed on the slowest link any neighbour pair crosses.
CommCost send_recv(const Cluster& c, Group g, double bytes);
Level group_level(const Cluster& c, Group g);
// An all-gather (gather = true) or reduce-scatter of the engine's own tensors inside one node, at
// the calibration's fit of that collective (Device::ag_* / rs_*) where the intra-node link is the
// calibrated one; otherwise all_gather / reduce_scatter above. measured (when given): whether the
// fit was taken.
CommCost ring_phase(const Cluster& c, Group g, double bytes, bool gather, bool* measured = nullptr);
// Sequence parallelism's replacement of one tensor-parallel all-reduce: an all-gather and a
// reduce-scatter of the same activation. With measured fits each is one call at its own cost
// (ring_phase); without, the all-reduce it replaces (the same bytes and latencies on a ring).
CommCost sp_pair(const Cluster& c, Group g, double bytes, bool* measured = nullptr);

}  // namespace atl::plan
