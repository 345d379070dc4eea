// GPT's parallel plan (torchtitan's parallelize_llama, for this model): each transformer block is
// an FSDP unit; under tensor parallelism (Shoeybi et al., "Megatron-LM", 2019) attention's fused
// QKV and the MLP's first layer split column-wise, their output projections row-wise (one
// all-reduce per sub-layer, or a reduce-scatter under sequence parallelism), and the token table
// and untied head by vocabulary rows. The fused layers split per part: c_attn's columns are
// [q | k | v], each cut over the group so that a rank holds whole query heads and the KV heads
// they share (GQA); SwiGLU's c_fc is [gate | up], cut so that a rank's gate and up columns match.
// Under context parallelism every layer runs on the rank's share of the sequence and the attention
// modules reach the rest of it (ring attention, src/parallel/context_parallel.cpp).
#include <fmt/format.h>

#include "models/gpt/gpt.h"

namespace atl::nn {

void check_tensor_parallel(const GPTConfig& c, int64_t tp) {
  ATOLL_CHECK(tp >= 1, "parallel.tp = {} must be at least 1", tp);
  ATOLL_CHECK(c.n_head % tp == 0, "parallel.tp = {}: model.n_head = {} is not divisible by it (tensor parallelism "
              "gives each rank whole attention heads)", tp, c.n_head);
  ATOLL_CHECK(c.n_kv_head % tp == 0, "parallel.tp = {}: model.n_kv_head = {} is not divisible by it (each rank "
              "needs whole key/value heads for its query heads)", tp, c.n_kv_head);
  ATOLL_CHECK(c.ffn() >= tp && c.vocab_size >= tp, "parallel.tp = {}: the MLP's {} hidden units or the vocabulary of "
              "{} cannot give every rank a share", tp, c.ffn(), c.vocab_size);
}

ParallelPlan GPT::parallelize() const {
  ParallelPlan plan;
  const int64_t hd = c_.head_dim(), F = c_.ffn();
  plan.add(wte->name(), ParallelStyle::vocab_rowwise, {c_.vocab_size});
  for (const Block* b : h) {
    plan.add(b->name(), ParallelStyle::shard_unit);
    plan.add(b->attn->c_attn->name(), ParallelStyle::colwise, {c_.n_head * hd, c_.n_kv_head * hd, c_.n_kv_head * hd});
    plan.add(b->attn->c_proj->name(), ParallelStyle::rowwise, {c_.n_head * hd});
    plan.add(b->attn->name(), ParallelStyle::sequence);
    plan.add(b->mlp->c_fc->name(), ParallelStyle::colwise, c_.swiglu ? std::vector<int64_t>{F, F} : std::vector<int64_t>{F});
    plan.add(b->mlp->c_proj->name(), ParallelStyle::rowwise, {F});
  }
  if (lm_head) plan.add(lm_head->name, ParallelStyle::vocab_rowwise, {c_.vocab_size});
  GPTConfig c = c_;
  plan.make_tp_shard = [c](const TensorParallelContext& tp) -> std::unique_ptr<Model> {
    return std::make_unique<GPT>(c, &tp);
  };
  return plan;
}

}  // namespace atl::nn
