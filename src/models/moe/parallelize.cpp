// The MoE family's parallel plan: each decoder layer is an FSDP/ZeRO-3 unit, and each MoE layer's
// stacked routed experts are expert-parallel (placed over the mesh's ep axis by
// src/parallel/expert_parallel.cpp, which moves the routed tokens with all-to-all).
// Tensor parallelism (Shoeybi et al., "Megatron-LM", 2019), as Megatron-Core composes it with
// expert parallelism: attention's fused QKV, the dense FFNs' and the shared experts' gate/up
// projections split column-wise (per part: [q | k | v], [gate | up]), their output projections
// row-wise, the token table and the untied head by vocabulary rows; the routed experts are not
// split over tp (each tp rank routes its own sequence-parallel share of the tokens to whole
// experts over its ep group, docs/moe.md); the router and the norms are replicated.
// Context parallelism (GPT's ring attention, models/gpt/parallelize.cpp): every layer runs on the
// rank's spans of each row, the attention modules reach the rest through the ring, and each
// router routes its rank's tokens (to the ep group's experts under ep x cp) with its balance
// statistics summed over cp (nn/moe.h).
#include "models/moe/moe_model.h"

namespace atl::nn {

ParallelPlan MoEModel::parallelize() const {
  ParallelPlan plan;
  const GPTConfig& a = c_.attn;
  const int64_t hd = a.head_dim(), F = a.ffn();
  const int64_t Fs = c_.moe.n_shared * (c_.moe.shared_ffn > 0 ? c_.moe.shared_ffn : c_.moe.expert_ffn);
  auto parts = [](int64_t f, bool swiglu) { return swiglu ? std::vector<int64_t>{f, f} : std::vector<int64_t>{f}; };
  plan.add(embed_tokens->name(), ParallelStyle::vocab_rowwise, {a.vocab_size});
  for (const MoEBlock* b : layers) {
    plan.add(b->name(), ParallelStyle::shard_unit);
    plan.add(b->self_attn->c_attn->name(), ParallelStyle::colwise, {a.n_head * hd, a.n_kv_head * hd, a.n_kv_head * hd});
    plan.add(b->self_attn->c_proj->name(), ParallelStyle::rowwise, {a.n_head * hd});
    plan.add(b->self_attn->name(), ParallelStyle::sequence);  // ring attention under cp (set_context_attention)
    const FeedForward* ffn = b->moe ? b->moe->shared : b->dense;
    if (ffn) {
      const int64_t f = b->moe ? Fs : F;
      plan.add(ffn->gate_up_proj->name(), ParallelStyle::colwise, parts(f, b->moe ? c_.moe.swiglu : a.swiglu));
      plan.add(ffn->down_proj->name(), ParallelStyle::rowwise, {f});
    }
    if (b->moe) {
      plan.add(b->moe->w_gate_up->name, ParallelStyle::expert);
      plan.add(b->moe->w_down->name, ParallelStyle::expert);
    }
  }
  if (lm_head) plan.add(lm_head->name(), ParallelStyle::colwise, {a.vocab_size});
  MoEModelConfig c = c_;  // with this model's expert sharding (expert_shard), if any
  plan.make_tp_shard = [c](const TensorParallelContext& tp) -> std::unique_ptr<Model> {
    return std::make_unique<MoEModel>(c, &tp);
  };
  return plan;
}

}  // namespace atl::nn
