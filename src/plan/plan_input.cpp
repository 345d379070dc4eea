// Reading a planner input file (see plan_input.h and docs/plan.md for the keys).
#include "plan/plan_input.h"

#include "core/config.h"
#include "core/error.h"

namespace atl::plan {

PlanInput read_plan_input(Config& cfg, bool finish) {
  PlanInput in;
  in.model = load_model(cfg, "model");
  in.cluster = load_cluster(cfg, "cluster");
  in.dp_given = cfg.has("plan.dp");
  in.layout = load_layout(cfg, "plan");
  if (!in.dp_given) {
    int64_t mp = in.layout.tp * in.layout.pp * in.layout.cp;
    ATOLL_CHECK(in.cluster.world() % mp == 0,
                "layout: the cluster's {} devices are not a multiple of tp×pp×cp = {}×{}×{} = {}", in.cluster.world(),
                in.layout.tp, in.layout.pp, in.layout.cp, mp);
    in.layout.dp = in.cluster.world() / mp;
  }
  in.train_tokens = cfg.get_float("run.tokens", 1e12, 1, 1e20);
  in.fault.checkpoint_s = cfg.get_float("run.checkpoint_s", 0, 0, 1e9);
  in.fault.interval_s = cfg.get_float("run.checkpoint_interval_s", 0, 0, 1e12);
  in.fault.mtbf_s = 3600 * cfg.get_float("run.mtbf_hours", 0, 0, 1e12);
  in.fault.device_mtbf_s = 3600 * cfg.get_float("run.device_mtbf_hours", 0, 0, 1e15);
  in.fault.restart_s = cfg.get_float("run.restart_s", 0, 0, 1e9);
  if (finish) cfg.finish();
  return in;
}

}  // namespace atl::plan
