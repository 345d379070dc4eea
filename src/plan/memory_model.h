// Memory per device: model states by ZeRO stage (Rajbhandari et al. 2020, "ZeRO: Memory
// Optimizations Toward Training Trillion Parameter Models", §3-5) and activations per layer
// (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
// Table 2), generalised term by term to GQA, SwiGLU, MoE and flash attention.
#pragma once
#include <cstdint>
#include <string>

#include "plan/explain.h"
#include "plan/layout.h"

namespace atl::plan {

// Activation bytes one transformer layer keeps for one micro-batch of `b` sequences of `s`
// tokens on one device, with tensor parallelism t and the given options.
struct ActivationOptions {
  int64_t t = 1;
  bool sp = false;
  std::string recompute = "none";
  double act_bytes = 2;  // bytes per stored activation element (masks are 1 byte)
  bool moe_layer = false;
};
double layer_activation_bytes(const ModelSpec& m, int64_t b, int64_t s, const ActivationOptions& o);

// Model-state bytes per parameter: weights, gradients and optimizer state (the K of
// Rajbhandari et al.: 12 for mixed-precision Adam).
struct StateBytes {
  double weight, grad, optim;
};
StateBytes state_bytes(const std::string& precision, const std::string& optimizer);

// ZeRO model-state bytes for psi parameters sharded over nd data-parallel ranks.
double zero_model_state_bytes(double psi, int stage, int64_t nd, const StateBytes& sb);

struct MemoryBreakdown {
  double params = 0, grads = 0, optimizer = 0, activations = 0, buffers = 0;
  double total = 0, capacity = 0, margin = 0;  // margin = capacity - total
  bool oom = false;
  double params_per_device = 0;  // parameter count resident (before ZeRO sharding)
};

MemoryBreakdown predict_memory(const ModelSpec& m, const Layout& l, const Cluster& c, Recorder& rec);

// Layers held by one pipeline stage (the largest stage).
int64_t layers_per_stage(const ModelSpec& m, const Layout& l);

}  // namespace atl::plan
