// Fleet pressure for workload-aware sync (WA-DiLoCo, "Not Every Sync Is Safe: Calibrated DiLoCo
// Scheduling for Shared AI Infrastructure"): the serving load on the hardware the islands share,
// one value per wall step (the trainer's step index), as a fraction of serving capacity.
// Either generated (seeded, so every rank of every island builds the same trace) or replayed from
// a recorded file (every rank reads the same file): decisions drawn from it agree without talk.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atl::lowcomm {

struct BurstyTraceParams {
  uint64_t seed = 1;
  double base = 0.2;        // load between bursts
  double p_start = 0.05;    // per-step chance a burst starts (off -> on)
  double p_end = 0.25;      // per-step chance it ends (on -> off): bursts last 1 / p_end steps on average
  double pareto_alpha = 1.5;  // burst height ~ Pareto(alpha) (heavy tail), scaled by burst_scale
  double burst_scale = 0.3;
  double noise = 0.02;      // uniform jitter on every step
};

class LoadTrace {
 public:
  // A Markov-modulated on/off process: a two-state chain (off, on); each burst draws its height
  // once from a Pareto tail, so a few bursts saturate the fleet. Clipped to [0, 1].
  static LoadTrace bursty(int64_t steps, const BurstyTraceParams& p);
  // One value per line, or CSV whose last column is the value (a header line of non-numbers is
  // skipped; '#' comments and blank lines too). A malformed line is refused with its number.
  static LoadTrace read(const std::string& path);
  explicit LoadTrace(std::vector<double> v) : v_(std::move(v)) {}
  LoadTrace() = default;

  // The load at wall step t; past the end the trace wraps (a recorded day replays).
  double at(int64_t t) const;
  int64_t size() const { return int64_t(v_.size()); }
  const std::vector<double>& values() const { return v_; }
  void write(const std::string& path) const;

 private:
  std::vector<double> v_;
};

// A small deterministic generator (splitmix64): the same stream on every machine and standard
// library, unlike std::uniform_*_distribution.
struct SplitMix {
  uint64_t s;
  uint64_t next();
  double uniform();  // [0, 1)
};

}  // namespace atl::lowcomm
