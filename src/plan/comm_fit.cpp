// Robust alpha-beta fit of measured all-reduce timings (see comm_fit.h).
#include "plan/comm_fit.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace atl::plan {

double median_of(std::vector<double> v) {
  ATOLL_CHECK(!v.empty(), "median of no timings");
  std::sort(v.begin(), v.end());
  const size_t k = v.size();
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

namespace {
// Theil–Sen line through the per-size medians: slope and intercept set, latency and bandwidth not.
AlphaBetaFit theil_sen(const std::map<double, std::vector<double>>& samples, const char* what) {
  AlphaBetaFit f;
  for (auto& [bytes, ts] : samples)
    if (!ts.empty()) f.medians.push_back({bytes, median_of(ts)});
  ATOLL_CHECK(f.medians.size() >= 2, "an alpha-beta fit needs timings of at least two message sizes, got {}",
              f.medians.size());
  std::vector<double> slopes;
  for (size_t i = 0; i < f.medians.size(); ++i)
    for (size_t j = i + 1; j < f.medians.size(); ++j)
      slopes.push_back((f.medians[j].second - f.medians[i].second) / (f.medians[j].first - f.medians[i].first));
  f.slope = median_of(slopes);
  ATOLL_CHECK(f.slope > 0, "{} time did not grow with message size (median slope {:.3g} s/B); the machine "
              "is probably too loaded to calibrate collectives, retry or use --no-collectives", what, f.slope);
  std::vector<double> rest;
  for (auto [x, y] : f.medians) rest.push_back(y - f.slope * x);
  f.intercept = median_of(rest);
  return f;
}
}  // namespace

AlphaBetaFit fit_all_reduce(const std::map<double, std::vector<double>>& samples, int n) {
  AlphaBetaFit f = theil_sen(samples, "all-reduce");
  const double steps = 2.0 * std::ceil(std::log2(double(std::max(2, n))));
  // A non-positive intercept is noise around a latency too small to see: half the smallest
  // message's median bounds it instead.
  f.latency = f.intercept > 0 ? f.intercept / steps : f.medians.front().second / steps * 0.5;
  f.bandwidth = 2.0 * (n - 1) / n / f.slope;
  return f;
}

AlphaBetaFit fit_ring_phase(const std::map<double, std::vector<double>>& samples, int n) {
  AlphaBetaFit f = theil_sen(samples, "all-gather / reduce-scatter");
  const double steps = double(std::max(1, n - 1));
  f.latency = f.intercept > 0 ? f.intercept / steps : f.medians.front().second / steps * 0.5;
  f.bandwidth = double(std::max(1, n - 1)) / std::max(2, n) / f.slope;
  return f;
}

GapWaitFit fit_gap_wait(const std::map<double, std::vector<std::pair<double, double>>>& samples) {
  GapWaitFit f;
  auto zero = samples.find(0.0);
  ATOLL_CHECK(zero != samples.end() && !zero->second.empty(),
              "a gap-wait fit needs the back-to-back level (gap 0) to measure the wait above");
  auto med = [](const std::vector<std::pair<double, double>>& v, bool second) {
    std::vector<double> x;
    for (auto& p : v) x.push_back(second ? p.second : p.first);
    return median_of(x);
  };
  f.base = med(zero->second, true);
  for (auto& [gap, v] : samples)
    if (gap > 0 && !v.empty()) f.medians.push_back({med(v, false), med(v, true) - f.base});
  ATOLL_CHECK(f.medians.size() >= 2, "a gap-wait fit needs at least two levels of compute between collectives, got {}",
              f.medians.size());
  std::vector<double> slopes;
  for (size_t i = 0; i < f.medians.size(); ++i)
    for (size_t j = i + 1; j < f.medians.size(); ++j)
      if (f.medians[j].first != f.medians[i].first)
        slopes.push_back((f.medians[j].second - f.medians[i].second) / (f.medians[j].first - f.medians[i].first));
  f.slope = slopes.empty() ? 0.0 : std::max(0.0, median_of(slopes));
  std::vector<double> rest;
  for (auto [x, y] : f.medians) rest.push_back(y - f.slope * x);
  f.intercept = std::max(0.0, median_of(rest));
  return f;
}

}  // namespace atl::plan
