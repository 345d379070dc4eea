// The optimizer of a ZeRO rank (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
// Trillion Parameter Models", SC 2020): it updates only this rank's shard of the flat buffers (the
// `own` spans of the layout's buckets) and keeps only that shard's state, yet saves and loads the
// state under the names and full shapes of the single-rank optimizer it stands for, so that a
// checkpoint moves between strategies and world sizes.
#pragma once
#include <functional>
#include <memory>

#include "comm/communicator.h"
#include "optim/optimizer.h"
#include "parallel/flat_layout.h"

namespace atl::parallel {

class ShardedOptimizer : public Optimizer {
 public:
  // Collective over `group` (the sharding group; null for one rank): the full state, on every rank.
  virtual void save_full_state(std::vector<std::pair<std::string, Tensor>>& out, comm::Communicator* group) const = 0;
  // Each rank takes its own part of the full state.
  virtual void load_full_state(const TensorFile& f) = 0;
};

// Builds a rank's sharded optimizer once ZeRO has laid out the buckets. `shard_group` is the
// communicator the buckets are sharded over (under HSDP the group of shards; null for one rank).
using ShardedOptimizerFactory = std::function<std::unique_ptr<ShardedOptimizer>(
    nn::Model& model, const FlatLayout& layout, comm::Communicator* shard_group)>;

}  // namespace atl::parallel
