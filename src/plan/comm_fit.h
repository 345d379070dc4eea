// Fitting the planner's alpha-beta cost of a collective to measured timings (`atoll plan
// calibrate`), robustly: on a loaded host one descheduled rank adds milliseconds to a single
// iteration, so every size is summarised by the median of its repeated timings, and the line
// t(B) = a + b·B through those medians by the Theil–Sen estimator (Theil 1950; Sen 1968): the
// slope is the median of the slopes between every pair of sizes and the intercept the median of
// t − b·B, so an outlying size moves neither. A least-squares line through mean times, which the
// first calibration used, lets the largest messages' noise set the intercept, i.e. the latency.
#pragma once
#include <map>
#include <utility>
#include <vector>

namespace atl::plan {

struct AlphaBetaFit {
  double bandwidth = 0;  // bus bandwidth, bytes/s: 2(n−1)/n / slope for a ring all-reduce
  double latency = 0;    // seconds per step: intercept / (2⌈log₂ n⌉), the planner's tree latency count
  double slope = 0, intercept = 0;
  std::vector<std::pair<double, double>> medians;  // (bytes, median seconds) per size
};

double median_of(std::vector<double> v);
// samples: bytes → repeated timings of an all-reduce over n ranks. Throws when the times do not
// grow with the size (a machine too loaded to measure).
AlphaBetaFit fit_all_reduce(const std::map<double, std::vector<double>>& samples, int n);

}  // namespace atl::plan
