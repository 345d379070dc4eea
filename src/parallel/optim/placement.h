// Where an optimizer's work and state go under data parallelism. Each optimizer type that has a
// distributed form registers it here by name (one file each in parallel/optim/, their maths
// called from optim/): under replicated strategies (DDP) a group's optimizer may become its
// distributed form (Muon: matrix owners; PRMuon: row-sharded momentum; Dion3: slice-sharded);
// under sharding strategies (ZeRO-1/2/3, HSDP) the hidden-matrix optimizer must have a sharded
// form over ZeRO's flat chunks, with AdamW's sharded form for everything else.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/registry.h"
#include "nn/model.h"
#include "optim/adamw.h"
#include "parallel/optim/sharded_optimizer.h"

namespace atl::parallel {

class TensorParallel;

// A distributed form of a group's optimizer under replicated data parallelism (DDP).
struct ReplicatedPlacement {
  // Reads the form's keys (optim.muon.distributed, ...), so that they are valid in every run.
  std::function<void(Config& cfg)> keys;
  // The form over comm, or null to keep the single-rank optimizer; may set note (for the log).
  std::function<std::unique_ptr<Optimizer>(Config& cfg, std::vector<ParamRef>& params, comm::Communicator* comm,
                                           std::string& note)>
      make;
  // What it does, for the error that names DDP as the alternative to an unshardable type.
  std::string describe;
};
Registry<ReplicatedPlacement>& replicated_placements();

// The rank's optimizer under a sharding strategy: the hidden matrices in this type, AdamW for the
// rest, built once ZeRO has laid out its buckets. tp (null: none) is the model's tensor
// parallelism: a matrix type must then update each split matrix whole (sharded_muon.h).
struct ShardedPlacement {
  std::function<ShardedOptimizerFactory(Config& cfg, const AdamWConfig& adamw, const TensorParallel* tp)> make;
  std::string note;  // for the log on several ranks
};
Registry<ShardedPlacement>& sharded_placements();

template <typename Entry>
struct PlacementRegistrar {
  PlacementRegistrar(Registry<Entry>& r, const std::string& optimizer, Entry e) { r.add(optimizer, std::move(e)); }
};

// The grouped optimizer over the parameters one rank steps, each parameter whole (a pipeline
// stage's, or its dp share of them under ZeRO): the single-rank optimizers compose there as they
// are, matrix ones included.
using RankOptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<ParamRef> params)>;

// What the trainer hands the data-parallel strategy (make_data_parallel) or the pipeline.
struct OptimizerPlacement {
  AdamWConfig adamw;               // [optim.adamw], read once
  std::unique_ptr<Optimizer> full;  // replicated strategies: the grouped optimizer; null: AdamW everywhere
  ShardedOptimizerFactory sharded;  // sharding strategies: null: ShardedAdamW everywhere
  RankOptimizerFactory per_rank;    // pipelines: null: AdamW everywhere
  std::string note;                 // how the optimizer is placed, for the log ("" when plainly)
};

// Reads [optim] (every key it may need, so that cfg.finish() can follow) and places the model's
// optimizer for a strategy that shards (ZeRO, HSDP) or replicates (DDP) it; comm null: one rank.
// tp (null: none) is this rank's tensor parallelism: each group whose type needs whole matrices
// then gets its tp form (tp_whole_matrix.h) instead of a replicated form over comm.
OptimizerPlacement place_optimizer(Config& cfg, nn::Model& model, comm::Communicator* comm, bool sharding,
                                   const std::string& strategy, TensorParallel* tp = nullptr);

// Under pipeline parallelism (any dp strategy): each rank steps whole parameters (its stages',
// under ZeRO whole ones placed on dp ranks), so every registered optimizer runs as on one rank
// over them. Reads every [optim] key the route uses now (before cfg.finish()); per_rank builds
// from cfg later, so cfg must outlive the calls to it (the trainer's constructor makes them all).
// Under pp x tp (tp non-null) a stage's split matrices are stepped whole as under tp alone (the tp
// ranks of a stage hold the same parameters: the pipeline agrees its dp placement over tp).
OptimizerPlacement place_pipeline_optimizer(Config& cfg, TensorParallel* tp = nullptr);

}  // namespace atl::parallel
