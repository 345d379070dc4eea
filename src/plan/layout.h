// A training layout: how a model is split over a cluster and how each step runs.
#pragma once
#include <cstdint>
#include <string>

#include "plan/cluster.h"
#include "plan/model_spec.h"

namespace atl {
class Config;
}

namespace atl::plan {

struct Layout {
  // Degrees. Ranks are ordered tp (innermost), cp, dp, pp (outermost), as Megatron-LM places
  // them, so tensor parallelism stays inside a node. EP groups are carved out of dp×cp.
  int64_t dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  int zero = 0;             // 0..3 (Rajbhandari et al. 2020); 3 is FSDP
  int64_t hsdp = 0;         // >0: ZeRO shards only within groups of this many dp ranks, replicated across
  bool sp = false;          // sequence parallelism over the tp group (Korthikanti et al. 2022)
  std::string schedule = "1f1b";  // "gpipe", "1f1b", "interleaved", "zb-h1"
  int64_t virtual_stages = 1;     // model chunks per device for the interleaved schedule
  int64_t micro_batch = 1;        // sequences per micro-batch
  int64_t global_batch = 0;       // sequences per step; 0: dp × micro_batch
  std::string recompute = "none";  // "none", "selective", "full"
  std::string precision = "bf16";  // "fp32", "bf16", "fp16", "fp8" (fp8 GEMMs, bf16 storage)
  std::string optimizer = "adam";  // "adam" (AdamW-class) or "muon" (Muon-class)
  std::string offload = "none";    // "none" or "optimizer" (state and step on the host)
  // Precision of the data-parallel gradient reduction: "grad" (the gradients' own dtype) or "fp32"
  // (PyTorch FSDP MixedPrecision(reduce_dtype=float32); Composer's mixed_precision = "DEFAULT").
  std::string reduce_dtype = "grad";
  // ZeRO-3: the framework copies each unit's unsharded gradients into the reduce-scatter's flat
  // input every micro-batch (PyTorch FSDP, DeepSpeed). 1 yes, 0 no (atoll: gradients accumulate in
  // the flat buffer the reduce-scatter reads), -1 by device (no on cpu-local, atoll's own runs).
  int fsdp_grad_copy = -1;
  bool overlap_dp = true;          // gradient sync overlaps the backward pass
  bool overlap_tp = false;         // tensor-parallel collectives overlap compute
  // Expert-parallel all-to-alls overlap another micro-batch's compute (DeepSeek-V3's DualPipe,
  // §3.2.1); exposed only where they outlast it.
  bool overlap_ep = false;
  // Pipeline sends and receives are asynchronous: each overlaps the compute of the next model
  // chunk (Llama 3: "we adopt asynchronous point-to-point communication in PP", Dubey et al. 2024
  // §3.3.2); exposed only where a send outlasts a chunk's forward.
  bool overlap_pp = false;
  int64_t diloco_h = 0;            // >0: DiLoCo, islands sync every H inner steps
  double diloco_compression = 1.0; // fraction of pseudo-gradient bytes sent (quantized / sparsified)
  int64_t gossip_peers = 0;        // >0: islands gossip with this many peers instead of all-reducing

  int64_t world() const { return dp * tp * pp * cp; }
  bool decentralized() const { return diloco_h > 0 || gossip_peers > 0; }
  // Data-parallel ranks that synchronise every step: all of dp, or with DiLoCo/gossip the
  // replicas inside one island (ranks are then placed island-major).
  int64_t dp_inner(int64_t islands) const { return decentralized() ? dp / islands : dp; }
  int64_t batch() const { return global_batch > 0 ? global_batch : dp * micro_batch; }
  int64_t micro_batches() const { return batch() / (dp * micro_batch); }  // per pipeline per step
  std::string describe() const;
};

// Throws an atl::Error naming the first constraint the layout breaks.
void validate_layout(const Layout& l, const ModelSpec& m, const Cluster& c);

// Reads the [plan] section.
Layout load_layout(Config& cfg, const std::string& section = "plan");

}  // namespace atl::plan
