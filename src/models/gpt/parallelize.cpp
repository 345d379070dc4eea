// GPT's parallel plan (torchtitan's parallelize_llama, for this model): each transformer block is
// an FSDP unit; under tensor parallelism (Shoeybi et al., "Megatron-LM", 2019) attention's fused
// QKV and the MLP's first layer split column-wise, their output projections row-wise (one
// all-reduce per sub-layer), and the token table and untied head by vocabulary rows. Under
// context parallelism every layer runs on the rank's share of the sequence and the attention
// modules reach the rest of it (ring attention, src/parallel/context_parallel.cpp).
#include "models/gpt/gpt.h"

namespace atl::nn {

ParallelPlan GPT::parallelize() const {
  ParallelPlan plan;
  plan.add(wte->name(), ParallelStyle::vocab_rowwise);
  for (const Block* b : h) {
    plan.add(b->name(), ParallelStyle::shard_unit);
    plan.add(b->attn->c_attn->name(), ParallelStyle::colwise);
    plan.add(b->attn->c_proj->name(), ParallelStyle::rowwise);
    plan.add(b->attn->name(), ParallelStyle::sequence);
    plan.add(b->mlp->c_fc->name(), ParallelStyle::colwise);
    plan.add(b->mlp->c_proj->name(), ParallelStyle::rowwise);
  }
  if (lm_head) plan.add(lm_head->name, ParallelStyle::vocab_rowwise);
  return plan;
}

}  // namespace atl::nn
