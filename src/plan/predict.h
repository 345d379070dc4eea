// The planner's analytical performance model (the "ShardMeter" model of sharded, multi-cluster
// and decentralized training): given a model, a cluster and a layout, predict memory per
// device, the step time split into its parts, throughput, MFU, time and cost, and the
// bottleneck. See docs/plan.md for the formulas and their sources.
#pragma once
#include <string>
#include <vector>

#include "plan/collective.h"
#include "plan/explain.h"
#include "plan/layout.h"
#include "plan/memory_model.h"

namespace atl::plan {

struct Prediction {
  MemoryBreakdown memory;
  // Step time parts, seconds. compute/memory-bound are per step on the slowest stage,
  // excluding the bubble; the comm parts are the exposed (not overlapped) times.
  double compute = 0, memory_bound = 0, recompute = 0;
  // Gradient buffers: zero-filling the gradient of every stored activation and of the parameters,
  // and the bias-gradient reductions over tokens (memory traffic outside the kernels above).
  double grad_buffers = 0;
  // ZeRO-3/FSDP framework memory traffic per micro-batch: the unsharded gradients copied into the
  // reduce-scatter's flat input, and cast to fp32 first where the reduction runs in fp32.
  double fsdp_copies = 0;
  // ZeRO-3 on a CPU (cpu-local, Device::page_fault_bw): atoll gives the pages of the values and
  // gradients a rank does not own back to the kernel after each use (parallel/page_release.cpp,
  // MADV_DONTNEED), so every gather and every gradient accumulation faults them in again, zero
  // filled: per micro-batch the non-owned values twice (forward, backward) and gradients once.
  double page_faults = 0;
  // Expert parallelism's copies outside the all-to-alls (ep_copy_bytes): every routed row packed
  // into the send buffer and unpacked from the receive buffer, in each of the micro-batch's four
  // exchanges (dispatch and combine, forward and backward).
  double ep_copies = 0;
  double bubble = 0;
  double optimizer = 0, offload = 0;
  CommCost tp, cp, ep, pp_p2p, dp, outer;  // exposed communication by kind and level
  // The step's own small collectives (step_protocol_collectives), per step: latency-bound.
  CommCost control;
  // cpu-local with collectives calibrated by CPU time: what the wall clock adds to the step while
  // a rank sleeps in a blocking collective for its peer (the step priced once more with the
  // calibration's wall-clock fit of the same all-reduces, less the step priced by CPU time).
  // Included in step; like the bubble, CPU time does not see it.
  double sync_wait = 0;
  // Of sync_wait: the wait the compute between the model-parallel collectives adds (tp, cp, ep:
  // Device::gap_wait_*), above the back-to-back waits the wall-clock fit holds.
  double gap_wait = 0;
  double gap_wait_points = 0;   // blocking collectives per step it is charged on
  double gap_wait_compute = 0;  // CPU seconds of compute between two of them
  // Share of the measured kernels' operand bytes found in the L3 (Device::l3_bytes over the
  // step's working set); 0 where the device has no cache-resident grid.
  double operands_in_l3 = 0;
  double step = 0;
  double tokens_per_step = 0;
  double tokens_per_s = 0, tokens_per_s_device = 0, tokens_per_s_island = 0;
  double model_flops_per_token = 0, hardware_flops_per_token = 0;
  double mfu = 0, hfu = 0, achieved_flops_per_device = 0;  // model FLOP/s per device
  double train_tokens = 0, train_seconds = 0, train_cost = 0, price_per_hour = 0;
  double fault_overhead = 0, checkpoint_interval = 0;  // fraction of wall time lost to failures; seconds
  std::string bottleneck;
  std::vector<Figure> figures;  // filled when explaining

  CommCost comm_total() const;
};

// Checkpointing against failures (Young 1974, "A first order approximation to the optimum
// checkpoint interval"; Daly 2006): a blocking checkpoint of `checkpoint_s` every interval τ, a
// mean time between failures of the job M (given, or a device's divided by the devices), and
// `restart_s` to restart and reload after each failure. All zero: no fault model.
struct FaultModel {
  double checkpoint_s = 0, interval_s = 0;  // interval 0: the optimum √(2·δ·M)
  double mtbf_s = 0, device_mtbf_s = 0, restart_s = 0;
  bool active() const { return checkpoint_s > 0 && (mtbf_s > 0 || device_mtbf_s > 0); }
};
// The job's MTBF on `devices` devices, the interval used, and the fraction of wall time lost:
// δ/τ (writing checkpoints) + (τ/2 + R)/M (on average half an interval of work redone, plus the
// restart, per failure).
double job_mtbf(const FaultModel& f, int64_t devices);
double checkpoint_interval(const FaultModel& f, int64_t devices);
double fault_overhead(const FaultModel& f, int64_t devices);

struct PredictOptions {
  bool explain = false;
  double train_tokens = 1e12;  // tokens to train, for time and cost
  FaultModel fault;            // checkpoint interval against MTBF (train time and cost only)
};

// Bytes one MoE layer's expert-parallel exchanges move through memory per micro-batch outside
// the collectives: each of the 4 all-to-alls (dispatch and combine, forward and backward) packs
// the rank's routed rows (tokens × top_k of width `hidden`, act_e bytes each) into a send buffer
// and unpacks the received rows: a read and a write each, 4 passes over the rows per exchange
// (parallel/expert_parallel.cpp, run_exchange). 0 without expert parallelism (one rank's
// experts read their rows in place).
double ep_copy_bytes(double tokens, double top_k, double hidden, double act_e, int64_t ep);

// The overlap formulas, exposed for their tests (docs/plan.md, "Communication"):
// FSDP micro-batch over `units` equal units with per-unit forward/backward compute and per-unit
// all-gather / reduce-scatter times; returns the time beyond the compute.
double fsdp_exposed(int64_t units, double fwd, double bwd, double ag, double rs);
// Bytes one FSDP unit of `unit_params` parameters moves per micro-batch outside the kernels
// (docs/plan.md, "ZeRO-3 / FSDP"): the unit's unsharded gradients (grad_e bytes each) read and
// written once into the reduce-scatter's flat input, 2·grad_e; with an fp32 reduction they are
// also cast, read at grad_e and written at 4 bytes, grad_e + 4. Both are unit-sized, not
// shard-sized, so they do not shrink as the job scales out.
// copy = false: the gradients already sit in the flat buffer (atoll's engine), only the cast.
double fsdp_copy_bytes(double unit_params, double grad_e, bool fp32_reduce, bool copy = true);
// Distributed Muon's step (DMuon; the engine's parallel/optim/muon_owner.h and sharded_muon.h):
// Newton–Schulz, 5 quintic iterations of 4r²c + 2r³ FLOPs on every hidden r×c matrix (r ≤ c;
// Jordan et al. 2024), each matrix on one owner; owners balanced longest-processing-time-first, so
// the step takes max(total/N, largest matrix) — the lower bound LPT reaches to within 4/3 (Graham
// 1969) — and no less than one matrix however many ranks share the work. exchange_bytes, fp32:
// under ZeRO (sharded) what each rank sends in each of two all-to-alls, its 1/N pieces of the H
// hidden parameters, 4·H/N (to the owners and back); under DDP the full buffer of the one
// all-gather of the owners' updates, 4·H.
struct MuonMatrix {
  double rows, cols, count;
};
struct MuonCost {
  double flops = 0, matrices = 0, owners = 1;
  double ns_total = 0, ns_largest = 0, ns = 0;  // seconds: all matrices on one device, the largest, the step's
  double exchange_bytes = 0, exchange = 0;      // seconds of the exchange filled in by predict()
};
MuonCost muon_step_cost(const std::vector<MuonMatrix>& mats, const Device& d, const std::string& precision,
                        double act_e, double owners, bool sharded);
// n equal gradient buckets of network time c each, ready evenly over a backward of `window`.
double bucketed_exposed(double n, double c, double window);
// Idle micro-batch slots of the pipeline per step ((p−1), (p−1)/v interleaved, (p−1)/3 ZB-H1) and
// the bubble's share of the pipeline time, idle / (m + idle): (p−1)/(m+p−1) for GPipe/1F1B,
// (p−1)/(v·m+p−1) interleaved, (p−1)/(3m+p−1) ZB-H1.
double pipeline_bubble_slots(const Layout& l);
double pipeline_bubble_fraction(const Layout& l);
// Forward-pass time of one layer's attention core for one micro-batch on device d (flash: with
// its 2.5× backward folded in as (1 + 2.5)/3, since the layer's backward is taken as 2×).
double attention_core_time(const ModelSpec& m, const Layout& l, const Device& d);
// Flash attention's forward+backward over 3 forward times at e_fwd: (1 + 2.5·e_fwd/e_bwd)/3, the
// backward at its own ceiling (Device::attention_backward_efficiency: FlashAttention-2's 63% vs
// 73% forward on an A100, Dao 2023 §1). And the causal share of the non-causal kernel time, 1/1.75
// (FlashAttention-2's measured 1.7-1.8× causal speed-up, §3.1.1).
// bwd_ceiling > 0 replaces the device's backward ceiling (the Triton kernel's, below).
double flash_backward_factor(const Device& d, double e_fwd, double fwd_flops, const std::string& precision,
                             double bwd_ceiling = 0);
double flash_causal_fraction();
// The fused kernel's forward and backward ceilings for m.attention_kernel: the device's
// FlashAttention-2 figures ("flash2"), or those ÷ 1.4 forward and ÷ 2 backward for the Triton
// FlashAttention ("triton"; FlashAttention-2 is "around 1.3-1.5× faster than FlashAttention in
// Triton in the forward pass and around 2× faster in the backward pass", Dao 2023 §4.1).
double flash_forward_ceiling(const Device& d, const ModelSpec& m);
double flash_backward_ceiling(const Device& d, const ModelSpec& m);

// The training step's own collectives beyond the layers' activations and the gradients (atoll's
// trainer and Megatron alike): a few bytes to one activation each, so they cost latency, which is
// microseconds on NVLink and milliseconds between processes over loopback TCP on a loaded CPU.
//  per micro-batch, under tp (vocab-parallel ends of the model on the stage that has them): the
//   embedding's reduce-scatter forward and all-gather backward (an all-reduce without SP), the
//   head input's all-gather forward and reduce-scatter backward (Megatron's f: an all-reduce
//   backward without SP), each the volume and hop count of one all-reduce of [b, s, h]; and the
//   vocab-parallel cross-entropy's two all-reduces, of the row maxima (4·b·s bytes) and of the
//   exponential sums with the target logits (8·b·s) (parallel/tensor_parallel_ops.cpp);
//  per step: over tp, the replicated parameters' partial gradients (the norms' weights, summed
//   once: TensorParallel::finish_backward), the gradient norm and the stop flag; over the data
//   group (dp·cp ranks; the whole world under pp, which is what PipelineParallel averages over)
//   the mean loss and the stop flag; under pp, the loss broadcast from the last stage and the
//   stages' squared gradient norms all-gathered. Every scalar travels as 2 floats (8 bytes).
struct StepProtocol {
  CommCost per_micro_batch, per_step;
};
StepProtocol step_protocol_collectives(const ModelSpec& m, const Cluster& c, const Layout& l);
// K/V passes per layer and micro-batch of atoll's ring attention (parallel/context_parallel.cpp):
// cp−1 forward; backward the blocks go round again (cp−1) with their dK/dV accumulators, which
// make cp hops to come home: 3·cp − 2 passes of the local K/V chunk.
double ring_attention_passes(int64_t cp);

// Validates the inputs (throws with the failing constraint) and predicts.
Prediction predict(const ModelSpec& m, const Cluster& c, const Layout& l, const PredictOptions& o = {});

}  // namespace atl::plan
