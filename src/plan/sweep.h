// Sweeps of one cluster or batch parameter, showing where scaling turns from compute-bound to
// communication-bound and where returns diminish (the ShardMeter analyses).
#pragma once
#include <string>
#include <vector>

#include "plan/search.h"
#include "plan/svg_plot.h"

namespace atl::plan {

struct SweepOptions {
  // "island_size" (nodes per island), "islands", "batch" (global batch, sequences),
  // "bandwidth" (inter-node GB/s per device), "wan_bandwidth" (inter-island GB/s).
  std::string param = "island_size";
  std::vector<double> values;
  bool best = false;  // search the best layout at every point instead of adapting dp only
  SearchOptions search;
  double train_tokens = 1e12;
};

struct SweepPoint {
  double value = 0;
  bool valid = false;
  std::string error;  // the constraint that failed
  Layout layout;
  int64_t devices = 0;
  Prediction p;
  double comm_fraction = 0, compute_fraction = 0, bubble_fraction = 0;
  std::string regime;  // the bottleneck's category
};

std::vector<std::string> sweep_params();
std::vector<SweepPoint> run_sweep(const ModelSpec& m, const Cluster& c, const Layout& l, const SweepOptions& o);
Plot sweep_plot(const std::vector<SweepPoint>& pts, const SweepOptions& o, const std::string& title);

}  // namespace atl::plan
