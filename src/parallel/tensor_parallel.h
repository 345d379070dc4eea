// Tensor and sequence parallelism over the mesh's tp axis (Shoeybi et al., "Megatron-LM", 2019;
// Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022).
//
// TensorParallel implements the model-side context (nn/tensor_parallel.h) with autograd ops around
// the tp communicator (tensor_parallel_ops.cpp): Megatron's conjugate pair f (identity forward,
// all-reduce backward) and g (all-reduce forward, identity backward) fused into the column- and
// row-parallel linears, their sequence-parallel forms (all-gather before the column-parallel
// linear, reduce-scatter after the row-parallel one, and the reverse in backward), the
// vocab-parallel embedding and cross-entropy. The gathers and scatters are split by row chunks so
// that each overlaps with the GEMM of the rows already at hand (see docs/parallel.md).
//
// Training around it: apply() swaps the model for this rank's shard (built by the model's plan,
// nn/parallel_plan.h); after backward, finish_backward() sums over the group the gradients of
// replicated parameters that each rank holds only part of; grad_norm() is the norm of the whole
// model's gradient; full_state()/local_state() convert this rank's state to the whole model's and
// back, so checkpoints hold the full model under its usual names and load at any tp.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/config.h"
#include "nn/model.h"
#include "nn/tensor_parallel.h"
#include "tensor/safetensors.h"

namespace atl::parallel {

class Mesh;
class DataParallel;

// Time the tp collectives took, for the benchmark: wait_s is what the compute thread spent
// blocked in wait(); standalone_s (from time_collectives) the same collectives run on their own.
struct TpCommStats {
  double wait_s = 0;
  double wait_overlapped_s = 0;  // of which in collectives that have compute to overlap
  int64_t collectives = 0;
};
struct TpCollectiveTimes {
  double all_s = 0, overlappable_s = 0;
};

class TensorParallel final : public nn::TensorParallelContext {
 public:
  // comm: the tp group (null or size 1: one rank, everything local).
  TensorParallel(comm::Communicator* comm, bool sequence_parallel);
  ~TensorParallel() override;

  // Replaces `model` by this rank's shard of it (same names, local shapes) and returns the context
  // it computes through (the context must outlive the model). Refuses, naming parallel.tp, a model
  // whose plan has no tensor parallelism or whose layout does not split.
  static std::unique_ptr<TensorParallel> apply(std::unique_ptr<nn::Model>& model, Mesh& mesh, bool sequence_parallel);

  // ---- nn::TensorParallelContext ----
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool sequence_parallel() const override { return sp_; }
  void begin_forward(int64_t B, int64_t T) const override;
  bool sequence_sharded() const override { return sharded_; }
  Tensor column_linear(const Tensor& x, const Tensor& w, const Tensor& b) const override;
  Tensor row_linear(const Tensor& x, const Tensor& w, const Tensor& b) const override;
  Tensor vocab_embedding(const Tensor& tokens, const Tensor& wte, int64_t lo, const Tensor& wpe) const override;
  Tensor vocab_logits(const Tensor& h, const Tensor& head) const override;
  Tensor vocab_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t lo) const override;
  Tensor gather_vocab(const Tensor& logits, int64_t V) const override;

  // ---- Megatron's region operators, unfused (tensor_parallel_regions.cpp) ----
  Tensor copy_to_region(const Tensor& x) const;      // f: identity forward, all-reduce backward
  Tensor reduce_from_region(const Tensor& x) const override;  // g: all-reduce forward, identity backward
  // x [n, C] (this rank's token rows) -> [size*n, C], rank 0's rows first; reduce-scatter backward.
  Tensor gather_sequence(const Tensor& x) const;
  // x [N, C] -> the sum over ranks of rows [r*N/size, (r+1)*N/size); all-gather backward.
  Tensor scatter_sequence(const Tensor& x) const;

  // ---- training ----
  // After the data-parallel finish_backward: sums partial gradients of replicated parameters.
  // Under ZeRO-2 (sums_before(dp)) before it instead, with the backward run unsynchronised
  // (dp.set_sync(false)) so that the reduce-scatter starts after it: ZeRO-2 keeps only this
  // rank's chunks of each bucket, and the tp ranks' chunks need not cover the same elements of a
  // replicated parameter (an uneven split of the vocabulary or the MLP changes bucket sizes and
  // so the chunk boundaries), so the tp sum must see whole gradients. The cost: ZeRO-2's
  // reductions do not overlap backward under tp.
  void finish_backward();
  bool sums_before(const DataParallel& dp) const;
  // Under ZeRO-3 / HSDP over dp (more than one rank): sums the partial gradients unit by unit,
  // just before each unit's reduce-scatter, instead of in finish_backward (which then does
  // nothing). Call once the data parallelism is built (tensor_parallel_fsdp.cpp).
  void attach(DataParallel& dp);
  // The whole model's gradient norm: squares of sharded parameters summed over the group,
  // replicated ones counted once (they are equal on every rank after finish_backward).
  double grad_norm();
  // The same over data parallelism dp: under ZeRO-2 each dp rank holds its chunks of the reduced
  // gradient only, so their squares are summed over dp first; otherwise grad_norm().
  double grad_norm(DataParallel& dp);  // (a pipeline's own norm, which counts tp, under pp)
  // Model and optimizer state of this rank (names as the model/optimizer give them) -> the whole
  // model's (collective over the group). Optimizer entries named "<param>.<what>" with the
  // parameter's local shape are gathered like the parameter; others are kept as they are.
  void full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                  std::vector<std::pair<std::string, Tensor>>& opt_state);
  // The reverse: the whole model's state -> this rank's pieces.
  void local_state(std::vector<std::pair<std::string, Tensor>>& model_sd, TensorFile& opt_state);

  // Whether this parameter of the shard is split over the group (else replicated), and a double
  // summed over the group (the same bits on every rank): for norms taken elsewhere (pipeline.h).
  bool sharded(const nn::Parameter* p) const;
  // A sharded parameter's whole tensor from every rank's `local` piece of it (a tensor of the
  // parameter's local shape: its value, gradient or a state), rank order as the plan cuts it;
  // collective over the group, every rank calling it for the same parameters in the same order.
  // (Parameters by name, as ParamRef names them.)
  bool sharded(const std::string& param) const;
  Shape full_shape(const std::string& param) const;  // the whole model's shape of it
  Tensor gather(const std::string& param, const Tensor& local) const;
  // This rank's piece of a whole tensor of a sharded parameter's full shape.
  Tensor take(const std::string& param, const Tensor& whole) const;
  // The whole-matrix optimizers' tp form (parallel/optim/tp_whole_matrix.h) keeps the state of
  // these parameters whole on every rank: full_state/local_state leave it as it is.
  void keep_state_whole(const std::string& param) { whole_state_.push_back(param); }
  double sum(double x);
  // True on every rank of the group when it is true on any (a stop request, say).
  bool any(bool mine);

  const TpCommStats& stats() const { return stats_; }
  // Replays the last forward+backward's tp collectives blocking, one after another, on scratch
  // buffers: seconds they take when nothing overlaps them.
  TpCollectiveTimes time_collectives();

  // For the ops (tensor_parallel_ops.cpp).
  comm::Communicator* comm() const { return comm_; }
  // overlapped: the op ran compute between issuing the collective and this wait.
  void wait(const comm::WorkPtr& w, bool overlapped = false) const;
  // A collective issued (kind: 0 all-reduce, 1 all-gather, 2 reduce-scatter; numel per rank).
  void note(int kind, int64_t numel, bool overlapped = false) const;
  int64_t B() const { return B_; }
  int64_t T() const { return T_; }

 private:
  struct ParamInfo {
    nn::Parameter* p;
    nn::ShardRule rule;
    Shape full;
    bool partial;  // replicated, but each rank's gradient is a part of the whole
  };
  const ParamInfo* info_of(const std::string& name) const;
  // The parameter an optimizer entry belongs to ("<param>.<what>", under a grouped optimizer
  // "<group>.<param>.<what>"), or null when the entry is not of a sharded parameter or its state
  // is kept whole.
  const ParamInfo* sharded_owner(const std::string& entry) const;
  void sum_partial(const std::vector<nn::Parameter*>& unit);
  Tensor gather_full(const ParamInfo& pi, const Tensor& local) const;

  comm::Communicator* comm_;
  int rank_ = 0, size_ = 1;
  bool sp_;
  mutable bool sharded_ = false;
  mutable int64_t B_ = 0, T_ = 0;
  mutable TpCommStats stats_;
  struct Issued {
    int kind;
    int64_t numel;
    bool overlapped;
  };
  mutable std::vector<Issued> issued_;  // this step's collectives, for time_collectives
  std::vector<ParamInfo> params_;
  std::vector<std::string> whole_state_;  // keep_state_whole()
  const nn::Model* model_ = nullptr;
  bool per_unit_ = false;  // attach(): partial gradients summed before each unit's reduce-scatter
};

// The trainer's entry: reads parallel.sequence_parallel (default true) and, when the mesh has
// tp > 1, refuses what does not compose yet (a strategy other than ddp, zero1/2/3 or hsdp, an
// optimizer that is not elementwise in any group, bf16 matmuls, a micro-batch of `tokens` that sequence
// parallelism cannot split) and applies TensorParallel::apply. Null when tp = 1.
std::unique_ptr<TensorParallel> apply_tensor_parallel(Config& cfg, std::unique_ptr<nn::Model>& model, Mesh& mesh,
                                                      const std::string& strategy, int64_t tokens);
// The communicator data parallelism runs over when tp > 1: the mesh's dp_shard axis under ZeRO
// (when it has more than one rank), else its dp_replicate axis; under HSDP both (dp_replicate x
// dp_shard); under cp x tp the ranks of this tp coordinate over dp x cp.
comm::Communicator* data_parallel_comm(Mesh& mesh);

}  // namespace atl::parallel
