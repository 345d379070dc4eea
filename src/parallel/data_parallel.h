// Data parallelism, one interface over its strategies: DDP (replicated model and optimizer,
// gradients all-reduced in buckets during backward), ZeRO stages 1-3 (optimizer state, then
// gradients, then parameters sharded across ranks) and HSDP (ZeRO-3 within groups of ranks,
// replicated across the groups). The trainer drives a step as
//
//   dp.zero_grad();
//   for each micro-batch m: dp.set_sync(m is the last); loss = model.loss(...); backward(loss, 1/accum);
//   dp.finish_backward();            // gradients now averaged over ranks (this rank's shard of them)
//   coef = clip_coefficient(dp.grad_norm(), max);   // the norm of the global gradient
//   dp.step({lr_scale, coef});       // the optimizer, and gathering updated parameters
//
// With no communicator (a single process) every call reduces to the plain single-rank loop.
//
// Uneven inputs (PyTorch's Join): before a step every rank calls join(has_data), which returns
// how many ranks have data. A rank without data still takes part in the step: it runs forward and
// backward on any batch (its last one, say) with backward seed 0, so it issues the same collectives
// and contributes zero gradient; gradients are averaged over the ranks that had data. Every rank
// stays in step with the same parameters; the loop ends when join() returns 0.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/codec.h"
#include "comm/communicator.h"
#include "core/config.h"
#include "core/registry.h"
#include "nn/model.h"
#include "optim/adamw.h"
#include "parallel/mesh.h"
#include "parallel/optim/sharded_optimizer.h"

namespace atl::comm {
class CompressedAllReducer;
}

namespace atl::parallel {

struct ParallelConfig {
  std::string strategy = "ddp";  // a registered strategy: ddp | zero1 | zero2 | zero3 | hsdp
  bool strategy_set = false;     // named by the config (else derived from the mesh)
  double bucket_mb = 25;         // MiB of f32 gradients per bucket (DDP, ZeRO-1/2)
  int hsdp_shard_size = 0;       // ranks per sharding group (hsdp); 0: the ranks of one node
  MeshShape mesh;                // after resolve_mesh
  comm::CodecSpec codec;         // [parallel] codec, error_feedback, codec_rounding, ... (DDP; comm/codec.h)
  double scape_sparsity = 0.9;   // [parallel] scape_sparsity: strategy "scape" (scape.h)
  bool scape_lazy = true;        // [parallel] scape_update = "lazy" | "dense"
  // strategy "coded" (resilience/coded_strategy.h): stragglers tolerated, and a test's straggler.
  int coded_stragglers = 1, coded_delay_rank = -1;
  double coded_delay_ms = 0;
  // [parallel] strategy, bucket_mb, hsdp_shard_size
  static ParallelConfig from_config(Config& cfg);
  // Reads the mesh axes of [parallel] (mesh.h) for world ranks; a config that names no strategy
  // gets the one its mesh stands for (dp_shard = 2 on 2 ranks: zero3), and hsdp its shard size.
  void resolve_mesh(Config& cfg, int64_t world, int64_t local_world);
};

// A data-parallel strategy, registered by name: whether it shards the optimizer over ZeRO's flat
// chunks (then it takes a ShardedOptimizerFactory, not a whole-model optimizer), and its maker.
class DataParallel;
struct StrategyEntry {
  bool sharding = false;
  std::function<std::unique_ptr<DataParallel>(nn::Model& model, comm::Communicator* comm, const ParallelConfig& pc,
                                              const AdamWConfig& ac, std::unique_ptr<Optimizer> opt,
                                              const ShardedOptimizerFactory& sharded, Mesh* mesh)>
      make;
};
Registry<StrategyEntry>& strategy_registry();

// Refuses mesh axes this build cannot run yet, or that the model's plan (Model::parallelize)
// does not cover, naming the key.
void check_mesh_supported(const MeshShape& mesh, const nn::Model& model);

class DataParallel {
 public:
  virtual ~DataParallel();
  virtual std::string name() const = 0;
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int world() const { return comm_ ? comm_->size() : 1; }
  comm::Communicator* comm() const { return comm_; }

  // Off during accumulation micro-steps: backward then only accumulates locally (no_sync).
  void set_sync(bool on) { sync_ = on; }
  bool sync() const { return sync_; }
  int join(bool has_data);
  // The mean of x over the ranks (for reporting the job's loss).
  double average(double x);

  virtual void zero_grad() = 0;
  virtual void finish_backward() = 0;
  virtual double grad_norm() = 0;
  virtual void step(const StepContext& ctx) = 0;
  Optimizer& optimizer() { return *opt_; }

  // Checkpoints hold the full model and the full optimizer state under the names a single-rank
  // AdamW uses, so they load under any strategy and world size. Both calls are collective.
  virtual void full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                          std::vector<std::pair<std::string, Tensor>>& opt_state) = 0;
  virtual void load_full_state(const std::vector<std::pair<std::string, Tensor>>& model_sd,
                               const TensorFile& opt_state, const std::string& what) = 0;
  // The gradient codec's compressed reduction ([parallel] codec; null without one) and the size
  // of each tensor it reduces, by key: its error feedback goes into checkpoints
  // (lowcomm/codec_checkpoint.h).
  virtual comm::CompressedAllReducer* gradient_codec() { return nullptr; }
  virtual std::vector<std::pair<std::string, int64_t>> gradient_codec_tensors() const { return {}; }
  // [lo, hi) ranges of the flat parameter values this rank keeps current between steps (ZeRO-3:
  // its own shards; the rest is released); empty: all of them.
  virtual std::vector<std::pair<int64_t, int64_t>> value_ranges() const { return {}; }

 protected:
  DataParallel(nn::Model& model, comm::Communicator* comm) : model_(model), comm_(comm) {}
  // 1 / ranks that contribute gradients this step; resets the join count for the next step.
  float take_grad_divisor();

  nn::Model& model_;
  comm::Communicator* comm_;  // null: one process
  std::unique_ptr<Optimizer> opt_;
  bool sync_ = true;
  int active_ = -1;  // ranks with data this step (-1: all)
};

// comm may be null (one process); world 1 with a communicator works too.
// opt, when given, is the optimizer over the full model (any type, e.g. from make_optimizer), for
// DDP; ZeRO strategies refuse it. They build their optimizer over the rank's shard: `sharded` when
// given (e.g. ShardedMuon, sharded_muon.h), else ShardedAdamW from ac. mesh (optional, over
// comm): the strategy takes its groups from the mesh's axes.
std::unique_ptr<DataParallel> make_data_parallel(nn::Model& model, comm::Communicator* comm,
                                                 const ParallelConfig& pc, const AdamWConfig& ac,
                                                 std::unique_ptr<Optimizer> opt = nullptr,
                                                 const ShardedOptimizerFactory& sharded = {}, Mesh* mesh = nullptr);

}  // namespace atl::parallel
