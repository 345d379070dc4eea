// Tensor parallelism as a model sees it (Shoeybi et al., "Megatron-LM", 2019; sequence parallelism
// from Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022).
// A model built for rank r of a tp group holds its shard of each planned parameter (parallel_plan.h)
// and runs the layers that need a collective through this context; src/parallel/tensor_parallel.cpp
// implements it over the mesh's tp communicator and injects it (nn/ and models/ know no
// communicator). A model without a context (null) is the plain one-rank model.
//
// Activations between the parallel regions (norms, residual adds) are either replicated over the
// group ([B,T,C] on every rank) or, under sequence parallelism, split over the tokens: rank r holds
// rows [r*N/tp, (r+1)*N/tp) of the flattened [N = B*T, C].
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "nn/parallel_plan.h"
#include "tensor/tensor.h"

namespace atl::nn {

class TensorParallelContext {
 public:
  virtual ~TensorParallelContext() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Configured sequence parallelism (parallel.sequence_parallel).
  virtual bool sequence_parallel() const = 0;

  // Called by the model at the start of each forward over [B,T] tokens: decides whether this forward
  // runs sequence-parallel (configured, and B*T divisible by size(); a training forward that is
  // not divisible is refused, an inference one falls back to replicated activations).
  virtual void begin_forward(int64_t B, int64_t T) const = 0;
  // Whether the current forward's activations between regions are split over the tokens.
  virtual bool sequence_sharded() const = 0;

  // Column-parallel linear: x (the region layout above) -> [B,T,OUT_r] = x_full · w + b with w
  // [IN, OUT_r] this rank's columns. Backward all-reduces (or reduce-scatters, under SP) dx.
  virtual Tensor column_linear(const Tensor& x, const Tensor& w, const Tensor& b) const = 0;
  // Row-parallel linear: x [B,T,IN_r] · w [IN_r, OUT] summed over the group (+ b once) -> the
  // region layout: replicated (all-reduce) or this rank's tokens (reduce-scatter).
  virtual Tensor row_linear(const Tensor& x, const Tensor& w, const Tensor& b) const = 0;
  // Vocab-parallel embedding: this rank holds table rows [lo, lo + wte.size(0)); each rank looks
  // up the tokens it owns (zeros elsewhere), the sum over the group is the embedding; wpe
  // (replicated, may be undefined) adds the learned positions. Returns the region layout.
  virtual Tensor vocab_embedding(const Tensor& tokens, const Tensor& wte, int64_t lo, const Tensor& wpe) const = 0;
  // The LM head's logits for this rank's vocabulary rows: h (region layout) -> [N, V_r] with the
  // head table [V_r, C] (nn.Linear layout).
  virtual Tensor vocab_logits(const Tensor& h, const Tensor& head) const = 0;
  // Mean cross-entropy over the kept targets (negative ignored) of logits [N, V_r] that hold
  // vocabulary columns [lo, lo + V_r): max and sum of exponentials all-reduced, the target logit
  // from the rank that owns it. Full logits are never gathered.
  virtual Tensor vocab_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t lo) const = 0;
  // Inference only: the full logits [N, V] from every rank's [N, V_r] (no gradient).
  virtual Tensor gather_vocab(const Tensor& logits, int64_t V) const = 0;
  // Megatron's g: x summed over the group in forward, the gradient passed through unchanged (each
  // rank's term of a sum over the group's token shards, an MoE layer's auxiliary losses and
  // routing counts under sequence parallelism, nn/moe.cpp). Contexts that need none leave it.
  virtual Tensor reduce_from_region(const Tensor& x) const { fail("this tensor-parallel context sums nothing"); }
};

// The rows [first, second) of `n` that rank r of `size` holds (n*r/size: uneven splits allowed).
inline std::pair<int64_t, int64_t> shard_range(int64_t n, int64_t r, int64_t size) {
  return {n * r / size, n * (r + 1) / size};
}

// How one parameter is split over the tp group (from the plan): along `dim`, as the concatenation
// of `segments` (full sizes), each segment cut by shard_range. dim < 0: replicated.
struct ShardRule {
  int dim = -1;
  std::vector<int64_t> segments;
  bool sharded() const { return dim >= 0; }
};
// The rule for parameter `param` of full shape `full` under the plan: colwise Linear: weight dim 1,
// bias dim 0; rowwise: weight dim 0 (its bias replicated); vocab_rowwise: dim 0; else replicated.
ShardRule shard_rule(const ParallelPlan& plan, const std::string& param, const Shape& full);
// The local shape of a parameter of full shape `full` on rank r of size.
Shape shard_shape(const ShardRule& rule, const Shape& full, int64_t r, int64_t size);
// Rank r's piece of a full tensor (a contiguous copy).
Tensor take_shard(const Tensor& full, const ShardRule& rule, int64_t r, int64_t size);
// Writes rank r's piece `local` into its place in `full`.
void put_shard(Tensor& full, const Tensor& local, const ShardRule& rule, int64_t r, int64_t size);

}  // namespace atl::nn
