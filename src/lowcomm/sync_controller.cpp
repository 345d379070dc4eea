// Sync policies for the DiLoCo family; see sync_controller.h.
#include "lowcomm/sync_controller.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace atl::lowcomm {

SyncPolicyConfig SyncPolicyConfig::from_config(Config& cfg, int64_t inner_steps) {
  SyncPolicyConfig c;
  c.period = inner_steps;
  c.policy = cfg.get_string("lowcomm.sync_policy", c.policy, sync_policy_registry().names());
  c.total_steps = cfg.get_int("train.steps", c.total_steps, 1, int64_t(1) << 40);
  if (c.policy == "workload_aware") {
    c.threshold = cfg.get_float("lowcomm.sync_threshold", c.threshold, -1e6, 1e6);
    c.load_weight = cfg.get_float("lowcomm.sync_load_weight", c.load_weight, 0.0, 1e6);
    c.ewma = cfg.get_float("lowcomm.sync_ewma", c.ewma, 0.0, 1.0);
    c.max_defer = cfg.get_int("lowcomm.sync_max_defer", 4 * inner_steps, 1, int64_t(1) << 40);
  }
  if (c.policy != "fixed") {
    c.trace = cfg.get_string("lowcomm.sync_trace", c.trace);
    c.trace_seed = cfg.get_int("lowcomm.sync_trace_seed", c.trace_seed, 0);
  }
  if (c.policy == "matched_random") {
    ATOLL_CHECK(cfg.has("lowcomm.sync_budget"),
                "lowcomm.sync_policy = 'matched_random' needs lowcomm.sync_budget (the number of syncs of the run it "
                "is matched to, e.g. the workload_aware run's count of sync records)");
    c.budget = cfg.get_int("lowcomm.sync_budget", 0, 0, c.total_steps);
    c.seed = cfg.get_int("lowcomm.sync_seed", c.seed, 0);
  }
  return c;
}

LoadTrace policy_trace(const SyncPolicyConfig& c) {
  if (!c.trace.empty()) return LoadTrace::read(c.trace);
  BurstyTraceParams p;
  p.seed = uint64_t(c.trace_seed);
  return LoadTrace::bursty(4096, p);
}

bool SyncController::should_sync(int64_t step) {
  ATOLL_CHECK(step >= next_, "sync policy: step {} asked after step {}", step, next_ - 1);
  bool now = false;
  for (; next_ <= step; ++next_) {  // replays the steps before a resumed run's first
    now = decide(next_, next_ - last_sync_);
    if (now) {
      last_sync_ = next_;
      ++syncs_;
    }
  }
  return now;
}

namespace {

class Fixed final : public SyncController {
 public:
  using SyncController::SyncController;
  std::string describe() const override { return fmt::format("fixed every {} steps", c_.period); }

 protected:
  bool decide(int64_t step, int64_t) override { return (step + 1) % c_.period == 0; }
};

class WorkloadAware final : public SyncController {
 public:
  explicit WorkloadAware(const SyncPolicyConfig& c) : SyncController(c), trace_(policy_trace(c)) {}
  std::string describe() const override {
    return fmt::format("workload_aware (threshold {}, load weight {}, EWMA {}, max deferral {} steps, trace {})",
                       c_.threshold, c_.load_weight, c_.ewma, c_.max_defer,
                       c_.trace.empty() ? fmt::format("bursty seed {}", c_.trace_seed) : c_.trace);
  }

 protected:
  bool decide(int64_t step, int64_t since) override {
    const double load = trace_.at(step);
    // One-step EWMA forecast of the next step's load: a burst that has begun keeps pressure up
    // for a step or two after the instantaneous load dips, and a rising load raises it early.
    if (step == 0) ewma_ = prev_ewma_ = load;
    ewma_ = c_.ewma * load + (1 - c_.ewma) * ewma_;
    const double forecast = load + (ewma_ - prev_ewma_);  // level plus the EWMA's last move
    prev_ewma_ = ewma_;
    const double pressure = std::max(load, forecast);
    const double score = double(since) / double(c_.period) - c_.load_weight * pressure;
    const bool forced = since >= c_.max_defer;
    const bool now = forced || score >= c_.threshold;
    last_ = {{"policy", "workload_aware"}, {"load", load}, {"forecast", forecast}, {"score", score},
             {"since_sync", since}, {"forced", forced}};
    return now;
  }

 private:
  LoadTrace trace_;
  double ewma_ = 0, prev_ewma_ = 0;
};

class MatchedRandom final : public SyncController {
 public:
  explicit MatchedRandom(const SyncPolicyConfig& c) : SyncController(c), at_(size_t(c.total_steps), false) {
    // Partial Fisher-Yates over the run's steps: `budget` distinct sync steps, uniformly.
    std::vector<int64_t> idx(static_cast<size_t>(c.total_steps));
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = int64_t(i);
    SplitMix r{uint64_t(c.seed) * 0x2545F4914F6CDD1Dull + 7};
    for (int64_t i = 0; i < c.budget; ++i) {
      int64_t j = i + int64_t(r.next() % uint64_t(c.total_steps - i));
      std::swap(idx[size_t(i)], idx[size_t(j)]);
      at_[size_t(idx[size_t(i)])] = true;
    }
  }
  std::string describe() const override {
    return fmt::format("matched_random ({} syncs over {} steps, seed {})", c_.budget, c_.total_steps, c_.seed);
  }

 protected:
  bool decide(int64_t step, int64_t since) override {
    last_ = {{"policy", "matched_random"}, {"since_sync", since}};
    return step < int64_t(at_.size()) && at_[size_t(step)];
  }

 private:
  std::vector<bool> at_;
};

}  // namespace

Registry<SyncPolicyMaker>& sync_policy_registry() {
  static Registry<SyncPolicyMaker> r = [] {
    Registry<SyncPolicyMaker> g("lowcomm sync policy");
    g.add("fixed", [](const SyncPolicyConfig& c) { return std::make_unique<Fixed>(c); });
    g.add("workload_aware", [](const SyncPolicyConfig& c) { return std::make_unique<WorkloadAware>(c); });
    g.add("matched_random", [](const SyncPolicyConfig& c) { return std::make_unique<MatchedRandom>(c); });
    return g;
  }();
  return r;
}

std::unique_ptr<SyncController> make_sync_controller(const SyncPolicyConfig& c) {
  return sync_policy_registry().get(c.policy, "lowcomm.sync_policy")(c);
}

}  // namespace atl::lowcomm
