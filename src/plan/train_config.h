// `atoll plan --emit-train-config`: a planned layout written as the [parallel] table (and the
// batch keys of [train]) of an atoll train config, in the device-mesh vocabulary of the engine's
// round-2 issue (dp_replicate, dp_shard, tp, pp, cp, ep; docs/plan.md, "Emitting a train config").
#pragma once
#include <string>

#include "plan/cluster.h"
#include "plan/layout.h"
#include "plan/model_spec.h"

namespace atl::plan {

// The mesh degrees of a layout: dp = dp_replicate × dp_shard (the ZeRO/FSDP shard group is
// dp_shard: all of dp, or hsdp ranks under HSDP; plain DDP has dp_shard = 1).
struct MeshDegrees {
  int64_t dp_replicate = 1, dp_shard = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  std::string strategy;  // today's trainer: "ddp", "zero1", "zero2", "zero3" or "hsdp"
};
MeshDegrees mesh_degrees(const Layout& l);

// keys: "mesh" (dp_replicate … ep, the round-2 [parallel] table), "legacy" (today's trainer:
// parallel.strategy and parallel.hsdp_shard_size; data parallelism only, so a layout with
// tp/pp/cp/ep > 1 is an error naming the degree) or "both". Throws atl::Error on a bad choice.
std::string train_config_toml(const ModelSpec& m, const Cluster& c, const Layout& l, const std::string& keys);

}  // namespace atl::plan
