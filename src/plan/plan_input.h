// One planner input: a TOML file with [model], [cluster], [plan] and [run] sections (all
// optional), plus command-line overrides, read through atl::Config so that unknown keys and wrong
// types are reported with file:line and the nearest valid key.
#pragma once
#include <string>

#include "plan/cluster.h"
#include "plan/layout.h"
#include "plan/model_spec.h"
#include "plan/predict.h"

namespace atl {
class Config;
}

namespace atl::plan {

struct PlanInput {
  ModelSpec model;
  Cluster cluster;
  Layout layout;
  double train_tokens = 1e12;
  FaultModel fault;  // [run] checkpoint_s, checkpoint_interval_s, mtbf_hours, device_mtbf_hours, restart_s
  bool dp_given = false;
};

// Reads every section; when [plan] dp is absent it is derived as world / (tp·pp·cp).
// Calls cfg.finish() unless `finish` is false (callers that read more keys finish themselves).
PlanInput read_plan_input(Config& cfg, bool finish = true);

}  // namespace atl::plan
