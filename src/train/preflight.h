// Checks made before the first step, so that a job that cannot fit is refused in a fraction of a
// second with the numbers, instead of being killed by the kernel's OOM killer after it has
// allocated the machine away from every other process.
#pragma once
#include <cstdint>
#include <string>

#include "nn/model.h"

namespace atl {

class Config;

struct MemoryEstimate {
  double model_states = 0;  // weights, gradients, optimizer state (this rank's share)
  double activations = 0;   // what one micro-batch keeps for the backward pass
  double logits = 0;        // the [B, T, vocab] logits, their softmax and gradient
  double total() const { return model_states + activations + logits; }
};

struct TrainShape {
  int64_t batch_size = 1, seq_len = 1;
  std::string optimizer = "adamw", strategy = "ddp", dtype = "f32";
  int world = 1, local_world = 1;
  // Model parallelism: a replica's ranks split its weights over tp and pp (ZeRO then shards over
  // the world / (tp x pp) data ranks); sp: the activations between blocks split over tp too; a
  // pipeline stage keeps its blocks' activations for up to `micro_batches` (gpipe) or
  // min(pp, micro_batches) micro-batches in flight. cp: a rank keeps the activations and logits of
  // its seq_len / cp tokens of every row (ring attention's K/V blocks are transient).
  int64_t tp = 1, pp = 1, cp = 1, micro_batches = 1;
  bool sequence_parallel = true;
  std::string pp_schedule = "1f1b";
};

// The planner's memory model (plan/memory_model.h: ZeRO model states, Korthikanti et al.'s
// per-layer activations with fp32 elements and flash attention's per-row statistics) applied to
// this engine's fp32 training; a lower bound, since the engine keeps a few more intermediates.
// A model without a transformer shape is counted by its parameters alone. Under tp and pp the
// figures are the worst rank's: the first or last stage's parameters split over tp.
MemoryEstimate estimate_training_memory(nn::Model& model, const TrainShape& s);

// Bytes this process may still allocate: /proc/meminfo's MemAvailable, lowered to the cgroup's
// limit minus its usage when one is set (v2 memory.max or v1 memory.limit_in_bytes). `source`
// says which figure bound it. Returns a negative value when nothing can be read.
double available_memory_bytes(std::string* source);

// Reads [train] force; unless it is true, fails naming the estimate, what is available and what
// to reduce when the ranks on this node would not fit.
void check_memory_before_start(Config& cfg, nn::Model& model, const TrainShape& s);

std::string format_bytes(double b);

}  // namespace atl
