// A model's statement of which parallelisms apply to which of its modules (as torchtitan's
// parallelize_<model> functions say it): the sharding units for FSDP/ZeRO-3, the linear layers
// that split column- or row-wise under tensor parallelism, the tables that split by vocabulary,
// expert modules for expert parallelism. Each family writes its plan in
// src/models/<family>/parallelize.cpp; src/parallel applies it on the device mesh and refuses a
// mesh axis (tp = 2, say) that the model's plan does not cover.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace atl::nn {

class Model;
class TensorParallelContext;

enum class ParallelStyle {
  shard_unit,     // FSDP/ZeRO-3 unit: gathered around its forward and backward
  colwise,        // Linear [in, out] split over out (tensor parallel, Megatron-LM's column-parallel)
  rowwise,        // Linear split over in; the outputs are summed over the tp group
  vocab_rowwise,  // embedding or head table split over its rows (the vocabulary)
  expert,         // experts placed over the ep group
  sequence,       // activations split over the sequence (context parallel)
};
const char* parallel_style_name(ParallelStyle s);

struct ModuleParallelism {
  std::string module;  // a module prefix ("transformer.h.3.attn.c_attn") or parameter name
  ParallelStyle style;
  // Tensor parallelism: the split dimension as a concatenation of parts each split over the
  // group (fused QKV: {q, k, v}; SwiGLU: {gate, up}); empty: one part (nn/tensor_parallel.h).
  std::vector<int64_t> segments = {};
};

struct ParallelPlan {
  std::vector<ModuleParallelism> entries;
  bool covers(ParallelStyle s) const {
    for (const auto& e : entries)
      if (e.style == s) return true;
    return false;
  }
  void add(std::string module, ParallelStyle s, std::vector<int64_t> segments = {}) {
    entries.push_back({std::move(module), s, std::move(segments)});
  }
  // Builds this model's shard for a tensor-parallel group (parameters at their local shapes, the
  // forward calling through the context); throws naming parallel.tp when the model cannot split
  // that way. Unset: the family has no tensor parallelism.
  std::function<std::unique_ptr<Model>(const TensorParallelContext& tp)> make_tp_shard;
};

}  // namespace atl::nn
