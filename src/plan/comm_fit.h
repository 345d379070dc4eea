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
// The same line for one ring phase alone, an all-gather or a reduce-scatter over n ranks, bytes
// being the full buffer (all-gather's output, reduce-scatter's input): t = (n−1)·latency +
// (n−1)/n · bytes / bandwidth. Sequence parallelism issues these, not all-reduces: on a CPU
// backend each is its own call with its own per-call cost (thread hand-off, syscalls, Gloo's
// rendezvous; atoll's reduce-scatter ring moves its last step in pieces), which half an
// all-reduce's fit does not give.
AlphaBetaFit fit_ring_phase(const std::map<double, std::vector<double>>& samples, int n);

// The wait a blocking collective adds when the ranks compute between collectives (`atoll bench
// comm --gap-us`): per gap level, (compute CPU seconds, the collective's wall − CPU seconds) of
// each iteration, the mean over the ranks. Back to back (gap 0) the ranks arrive together; the
// wait above that level is what training's compute between collectives adds: the peer's lateness
// (the spread of two ranks' compute, growing with its length) and the wake-up of a rank that
// slept. Fitted as extra(c) = intercept + slope·c through the gap levels' medians (compute,
// wait − the gap-0 median) by Theil–Sen; both clamped at 0 (a noisy level may dip below the
// back-to-back wait, which is no negative cost).
struct GapWaitFit {
  double intercept = 0;  // seconds per collective once any compute separates them (wake-up)
  double slope = 0;      // seconds of wait per second of compute before the collective (spread)
  double base = 0;       // median wait back to back (already in the wall-clock alpha-beta fit)
  std::vector<std::pair<double, double>> medians;  // (compute s, wait s above base) per level > 0
};
// samples: gap level (µs asked) → (compute s, wait s) per iteration. Needs the 0 level and at
// least two others.
GapWaitFit fit_gap_wait(const std::map<double, std::vector<std::pair<double, double>>>& samples);

}  // namespace atl::plan
