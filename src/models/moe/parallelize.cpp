// The MoE family's parallel plan: each decoder layer is an FSDP/ZeRO-3 unit, and each MoE layer's
// stacked routed experts are expert-parallel (placed over the mesh's ep axis by
// src/parallel/expert_parallel.cpp, which moves the routed tokens with all-to-all). Attention,
// the router, shared experts and dense FFNs stay data-parallel; tensor parallelism is not planned.
#include "models/moe/moe_model.h"

namespace atl::nn {

ParallelPlan MoEModel::parallelize() const {
  ParallelPlan plan;
  for (const MoEBlock* b : layers) {
    plan.add(b->name(), ParallelStyle::shard_unit);
    if (b->moe) {
      plan.add(b->moe->w_gate_up->name, ParallelStyle::expert);
      plan.add(b->moe->w_down->name, ParallelStyle::expert);
    }
  }
  return plan;
}

}  // namespace atl::nn
