// A mixture-of-experts feed-forward layer (Shazeer et al. 2017; GShard, Lepikhin et al. 2020;
// Switch, Fedus et al. 2021; DeepSeek-MoE, Dai et al. 2024): a router scores each token over E
// experts (softmax, or DeepSeek-V3's sigmoid), the top-k experts take the token, weighted by
// their scores (optionally renormalised over the k), and shared experts see every token. Experts
// are SwiGLU or GELU FFNs whose weights are stacked [E, ...], computed as ONE grouped GEMM over
// the tokens sorted by expert (ops::grouped_linear), never a loop of small GEMMs.
//
// Capacity: with drop_tokens, expert e takes at most ceil(capacity_factor * N * k / E) of a
// rank's N tokens; assignments are served first come, first served in (token, slot) order and
// the rest are dropped (their contribution is zero: the residual carries the token). Without
// drop_tokens every assignment is computed (no-drop, DeepSeek/Megablocks-style).
//
// Losses added to the model's loss: the load-balancing loss of Switch/GShard,
//   aux = E / (k N) * sum_e count_e * mean_n p[n, e]
// (count_e: assignments routed to e before dropping, p: router probabilities, the sigmoid scores
// renormalised per token in sigmoid mode), and ST-MoE's router z-loss mean_n logsumexp(logits_n)^2
// (Zoph et al. 2022), each times its coefficient.
//
// Where experts run is the dispatcher's business (ExpertDispatcher below): locally by default;
// expert parallelism (src/parallel/expert_parallel.cpp) injects one that moves the rows to the
// ranks holding their experts and back. nn/ knows no communicator.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "nn/context_attention.h"
#include "nn/layers.h"
#include "nn/model.h"
#include "nn/module.h"
#include "nn/tensor_parallel.h"

namespace atl::nn {

struct MoEConfig {
  int64_t dim = 0;           // model width C
  int64_t n_experts = 8;     // routed experts E
  int64_t top_k = 2;         // experts per token
  int64_t expert_ffn = 0;    // hidden width of one routed expert
  int64_t n_shared = 0;      // shared experts (one FFN of n_shared * shared_ffn)
  int64_t shared_ffn = 0;    // 0: expert_ffn
  std::string score = "softmax";  // softmax | sigmoid
  bool norm_topk = true;     // renormalise the k chosen scores to sum to one
  bool drop_tokens = false;  // capacity with dropping; false: no-drop
  double capacity_factor = 1.25;
  bool swiglu = true;        // else GELU experts
  // How the routed experts compute: "grouped" (one grouped GEMM per projection, the default) or
  // "loop" (one dense linear per expert with rows, the naive baseline the optimisation ladder
  // starts from, bench/moe_ladder.sh; same results to rounding, tested).
  std::string expert_gemm = "grouped";
  double aux_loss_coef = 0.01;
  double z_loss_coef = 0.001;
  // Sharded expert storage (expert parallelism, src/parallel/expert_parallel.h): the layer holds
  // only experts [expert_rank * E / expert_ranks, (expert_rank + 1) * E / expert_ranks), as its
  // own parameters outside the module tree (MoELayer::sharded_experts), so that data parallelism
  // neither stores nor reduces the other ranks' experts. 1: every expert, in the tree.
  int64_t expert_ranks = 1, expert_rank = 0;

  // Refuses a bad layout (top_k above E, capacity factor <= 0, ...) naming the key under `section`.
  void validate(const std::string& section = "model") const;
};

// Rows on the experts' side of a dispatch, and what the dispatcher needs to send results back.
struct ExpertBatch {
  Tensor rows;                   // [R, C], sorted by local expert
  std::vector<int64_t> offsets;  // [local experts + 1] into rows
  int64_t first_expert = 0;      // global index of local expert 0
  std::shared_ptr<void> state;   // the dispatcher's own bookkeeping for combine()
};

// Moves routed rows to the experts and results back; both directions are differentiable.
class ExpertDispatcher {
 public:
  virtual ~ExpertDispatcher() = default;
  virtual std::string name() const = 0;
  // rows [M, C]: this rank's routed rows sorted by global expert, counts[e] of them for expert e.
  virtual ExpertBatch dispatch(const Tensor& rows, const std::vector<int64_t>& counts, int64_t n_experts) = 0;
  // y [R, C'] in the order of batch.rows -> [M, C'] in the order of dispatch()'s rows.
  virtual Tensor combine(const Tensor& y, const ExpertBatch& batch) = 0;
  // A dispatcher that overlaps the experts' compute with the return exchange (tile-level) runs
  // both: the routed FFN (w_gate_up [E,C,2F or F], w_down [E,F,C]) over batch.rows, then the
  // combine, with the same outputs and gradients as combine(experts(rows)). Others leave it.
  virtual bool overlaps_experts() const { return false; }
  virtual Tensor experts_and_combine(const ExpertBatch& batch, const Tensor& w_gate_up, const Tensor& w_down,
                                     bool swiglu) {
    fail("dispatcher '{}' does not overlap experts with the combine", name());
  }
};

// Every expert on this rank (no expert parallelism).
class LocalDispatcher final : public ExpertDispatcher {
 public:
  std::string name() const override { return "local"; }
  ExpertBatch dispatch(const Tensor& rows, const std::vector<int64_t>& counts, int64_t n_experts) override;
  Tensor combine(const Tensor& y, const ExpertBatch&) override { return y; }
};

// A dense FFN (the shared experts): gate_up_proj [C, 2F] (SwiGLU) or [C, F] (GELU), down_proj [F, C].
// With a tensor-parallel context: Megatron's MLP, this rank's F/tp hidden units (gate_up column-
// parallel, cut per part {gate, up}; down_proj row-parallel); x and the result in the region layout.
class FeedForward : public Module {
 public:
  FeedForward(std::string prefix, int64_t dim, int64_t hidden, bool swiglu, const TensorParallelContext* tp = nullptr);
  Tensor operator()(const Tensor& x) const;
  Linear* gate_up_proj;
  Linear* down_proj;

 private:
  bool swiglu_;
  const TensorParallelContext* tp_;
};

// The router's decision for one forward (host-side bookkeeping plus the differentiable weights).
struct Routing {
  Tensor logits;                  // [N, E]
  Tensor probs;                   // [N, E] softmax, or sigmoid renormalised (the aux loss's p)
  Tensor weights;                 // [N, k] combine weights of the chosen experts
  std::vector<int32_t> experts;   // [N*k] chosen expert per (token, slot)
  std::vector<int64_t> counts;    // [E] assignments per expert before dropping
  std::vector<int64_t> kept;      // [E] after dropping
  Tensor order;                   // [M] i32: kept assignments (token*k + slot) sorted by expert
  Tensor token;                   // [M] i32: their tokens
};

class MoELayer : public Module {
 public:
  // tp: the tensor-parallel context of a model shard (nn/tensor_parallel.h), null without. Under
  // sequence parallelism the layer routes this tp rank's token rows only (Megatron-Core's MoE
  // with sequence parallelism): the routed experts are whole on every tp rank (replicated over tp,
  // split over ep only), the shared experts tensor-parallel, and the balance and z losses use the
  // whole tp group's tokens (counts and token total summed over tp, each rank's share of the sums
  // added with reduce_from_region), so they equal one rank's over the same tokens.
  MoELayer(std::string prefix, const MoEConfig& c, const TensorParallelContext* tp = nullptr);
  // x [..., C] -> [..., C]. Records this forward's auxiliary losses (aux_loss()).
  Tensor operator()(const Tensor& x) const;
  // The same with the routed experts replaced by `expert(rows, offsets, first_expert)` (tests:
  // an identity expert checks dispatch and combine alone).
  using ExpertFn = std::function<Tensor(const Tensor& rows, const std::vector<int64_t>& offsets, int64_t first)>;
  Tensor forward_with(const Tensor& x, const ExpertFn& expert) const;
  // The routed experts over rows sorted by expert (one grouped GEMM per projection).
  Tensor experts(const Tensor& rows, const std::vector<int64_t>& offsets, int64_t first) const;
  // The same as a loop of one ops::linear per expert (expert_gemm = "loop").
  Tensor experts_loop(const Tensor& rows, const std::vector<int64_t>& offsets, int64_t first) const;
  // x2: [N, C], `rows` sequences of N / rows tokens (under context parallelism with token dropping
  // the capacity is served in the whole rows' order, which needs the row boundaries).
  Routing route(const Tensor& x2, int64_t rows = 1) const;

  // Coefficient-weighted aux + z loss of the last forward (a scalar in its graph), and its parts.
  const Tensor& aux_loss() const { return aux_total_; }
  double last_balance_loss() const { return balance_value_; }
  double last_z_loss() const { return z_value_; }
  double last_dropped_fraction() const { return dropped_fraction_; }

  // nullptr: local experts. The dispatcher must outlive its use.
  void set_dispatcher(ExpertDispatcher* d) { dispatcher_ = d; }
  // Context parallelism (nn/context_attention.h; null: none): the layer routes this rank's tokens
  // only, and its balance and z losses take the whole row's counts and token total (summed over
  // the cp group), each rank's terms scaled by cp so that the group's mean is the one-rank loss.
  const ContextAttention* context = nullptr;
  const MoEConfig& config() const { return c_; }

  // Experts held here: [first_local_expert(), + local_experts()) (all of them unless sharded).
  int64_t local_experts() const { return c_.n_experts / c_.expert_ranks; }
  int64_t first_local_expert() const { return c_.expert_rank * local_experts(); }
  // Sharded storage: {w_gate_up, w_down}, this rank's experts only, not in parameters(); empty
  // when the layer holds every expert (then they are ordinary parameters).
  std::vector<Parameter*> sharded_experts() const;

  Parameter* gate;                  // router [E, C] (nn.Linear layout, as in HF files)
  Parameter* w_gate_up;             // [E, C, 2F] (SwiGLU) or [E, C, F]; sharded: [E / ranks, ...]
  Parameter* w_down;                // [E, F, C]; sharded: [E / ranks, F, C]
  FeedForward* shared = nullptr;    // n_shared > 0

 private:
  Tensor forward_impl(const Tensor& x, const ExpertFn* expert) const;  // expert null: the routed FFN
  MoEConfig c_;
  std::unique_ptr<Parameter> own_gate_up_, own_down_;  // sharded storage
  ExpertDispatcher* dispatcher_ = nullptr;
  const TensorParallelContext* tp_ = nullptr;
  mutable Tensor aux_total_;
  mutable double balance_value_ = 0, z_value_ = 0, dropped_fraction_ = 0;
};

// Models with MoE layers, for the parallel layer (which knows no model family): it injects the
// dispatcher of its expert-parallel group here.
class ExpertModel {
 public:
  virtual ~ExpertModel() = default;
  virtual int64_t num_experts() const = 0;
  virtual void set_expert_dispatcher(ExpertDispatcher* d) = 0;
  // The same architecture with sharded expert storage: its MoE layers hold only the experts of
  // ep rank `rank` of `ranks` (MoEConfig::expert_ranks); init_weights gives them the values the
  // unsharded model gives those experts.
  virtual std::unique_ptr<Model> expert_shard(int64_t ranks, int64_t rank) const = 0;
  // Every MoE layer's sharded expert parameters, in the order the unsharded model lists them
  // (empty when the experts are ordinary parameters).
  virtual std::vector<Parameter*> sharded_expert_parameters() const = 0;
  // Bytes one micro-batch of [batch, seq] tokens keeps for backward, roughly (0: unknown), for
  // the memory budget (train/memory_budget.h).
  virtual double activation_bytes(int64_t batch, int64_t seq) const { return 0; }
};

}  // namespace atl::nn
