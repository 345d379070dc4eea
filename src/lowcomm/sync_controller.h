// When the DiLoCo family syncs: a policy consulted after every inner step ("sync now?"),
// registered by name ([lowcomm] sync_policy):
//   fixed           every H = inner_steps steps (DiLoCo's schedule; the default).
//   workload_aware  WA-DiLoCo ("Not Every Sync Is Safe: Calibrated DiLoCo Scheduling for Shared
//                   AI Infrastructure"): score = progress - load_weight * pressure, where progress
//                   = steps since the last sync / H and pressure = max(load now, one-step EWMA
//                   forecast of the load) read from a serving-load trace (load_trace.h) at the
//                   current wall step; syncs when score >= threshold, and always once max_defer
//                   steps have passed without one.
//   matched_random  the control that isolates timing from budget: exactly sync_budget syncs over
//                   the run's train.steps, at steps drawn without replacement by a seeded RNG.
// Agreement across ranks: every policy decides from data every rank has (the step, the config,
// the seed, the trace generated from its seed or read from the same file), so all ranks decide
// alike without a message; nothing is broadcast. A recorded trace must be the same file on every
// host. Decisions depend on the step sequence only, so a resumed run replays them from step 0
// (no checkpoint state).
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/registry.h"
#include "lowcomm/load_trace.h"

namespace atl::lowcomm {

struct SyncPolicyConfig {
  std::string policy = "fixed";
  int64_t period = 50;        // H (lowcomm.inner_steps)
  int64_t total_steps = 200;  // train.steps (matched_random's horizon)
  // workload_aware
  double threshold = 1.0, load_weight = 1.0, ewma = 0.5;
  int64_t max_defer = 0;  // 0: 4 H
  // The trace: a recorded file (sync_trace), or the bursty generator seeded by sync_trace_seed.
  std::string trace;
  int64_t trace_seed = 1;
  // matched_random
  int64_t budget = 0;
  int64_t seed = 1;
  // Reads the [lowcomm] sync_* keys (ranges checked).
  static SyncPolicyConfig from_config(Config& cfg, int64_t inner_steps);
};

class SyncController {
 public:
  explicit SyncController(const SyncPolicyConfig& c) : c_(c) {}
  virtual ~SyncController() = default;
  virtual std::string describe() const = 0;
  // After the inner step `step` (0-based): whether the islands sync now. Called once per step in
  // order; a first call past step 0 (a resumed run) replays the steps before it.
  bool should_sync(int64_t step);
  int64_t syncs() const { return syncs_; }
  // What the last decision saw (for the sync record in metrics.jsonl).
  const nlohmann::json& last() const { return last_; }

 protected:
  virtual bool decide(int64_t step, int64_t since_sync) = 0;
  SyncPolicyConfig c_;
  nlohmann::json last_ = nlohmann::json::object();

 private:
  int64_t next_ = 0, last_sync_ = -1, syncs_ = 0;
};

using SyncPolicyMaker = std::function<std::unique_ptr<SyncController>(const SyncPolicyConfig&)>;
Registry<SyncPolicyMaker>& sync_policy_registry();
std::unique_ptr<SyncController> make_sync_controller(const SyncPolicyConfig& c);

// The trace a policy reads: the file when named, else bursty(4096 steps, seed) (it wraps).
LoadTrace policy_trace(const SyncPolicyConfig& c);

}  // namespace atl::lowcomm
