// Accelerator catalog: peak FLOP/s per dtype, memory size and bandwidth, and the fraction of
// peak a GEMM of a given size achieves. "cpu-local" is filled from `atoll plan calibrate`.
#pragma once
#include <array>
#include <string>
#include <utility>
#include <vector>

namespace atl {
class Config;
}

namespace atl::plan {

struct Device {
  std::string name;
  std::string note;  // provenance of the figures
  double fp32 = 0, tf32 = 0, bf16 = 0, fp8 = 0;  // dense peak FLOP/s (0: unsupported)
  double mem_bytes = 0;     // device memory
  // Bytes/s a kernel actually streams: the datasheet figure × mem_bw_efficiency on catalog GPUs
  // (no kernel reaches the datasheet HBM rate, see kHbmAchievable in hardware.cpp); as measured on
  // cpu-local (efficiency 1).
  double mem_bw = 0;
  double mem_bw_efficiency = 1.0;
  double intra_bw = 0;      // default intra-node bytes/s per device (NVLink, xGMI or PCIe)
  double inter_bw = 0;      // default inter-node bytes/s per device (NIC share)
  double host_bw = 0;       // host link (PCIe / C2C) bytes/s, used by offload
  // Measured links (cpu-local after `plan calibrate`): the bus bandwidth a collective reached and
  // its per-step latency. Measured figures are used as given, not derated like datasheet ones.
  bool links_measured = false;
  double intra_latency = 3e-6;  // seconds per collective step inside a node
  // Measured rates of the engine's own non-GEMM kernels (cpu-local; 0: not measured, then
  // element-wise traffic moves at mem_bw and attention cores run on the GEMM curve).
  double elementwise_bw = 0;   // bytes/s the element-wise kernels (norms, GELU, residual) reach
  double attention_flops = 0;  // FLOP/s of the fused attention kernel, 3× forward FLOPs / (fwd+bwd)
  // The same rate against the forward FLOPs of one call (every head of a micro-batch): larger
  // calls stream Q, K and V from further out in the cache hierarchy and run slower. When present
  // it replaces attention_flops (interpolated in log FLOPs, clamped at its ends).
  std::vector<std::pair<double, double>> attention_curve;
  // The same for one context-parallel rank's ring attention at cp = 2 (cpu-local; empty: not
  // measured, then attention_curve): the engine's block kernels (attention_block.cpp) over the
  // balanced head-and-tail chunks, against the FLOPs the planner counts for that rank's queries.
  // The block kernels take [q-block, k-block] ranges instead of the fused causal loop, and run
  // at their own rate. Measured at cp = 2 only and used for every cp (an assumption: at larger cp
  // the blocks are smaller and more of them are wholly visible).
  std::vector<std::pair<double, double>> ring_attention_curve;
  // Parameters per second the engine's AdamW update and gradient norm reach (cpu-local; 0: not
  // measured). Where the update's arithmetic is slower than streaming its bytes, this bounds it.
  double optimizer_params_per_s = 0;
  double price_hour = 0;    // default price per device-hour, USD
  double reserved_bytes = 0;  // runtime/context memory not available to the model
  // The whole machine (cpu-local): the devices of a node are ranks that share its cores, memory
  // and memory bandwidth, so a cluster divides them by devices_per_node.
  bool shared_by_node = false;
  // Whether a GEMM's operand traffic overlaps its arithmetic (a roofline: the larger of the two).
  // A GPU streams tiles while it computes; a CPU BLAS (OpenBLAS, cpu-local) first packs A and B
  // into contiguous panels and then writes C, passes that add to the arithmetic, so a thin GEMM
  // (k or n of 64) costs noticeably more than a square one of the same FLOPs.
  bool gemm_overlaps_memory = true;
  // GEMM efficiency curve: (2·m·n·k, achieved/peak) points, interpolated in log(flops).
  std::vector<std::pair<double, double>> gemm_curve;
  // The engine's linear layers on token-major shapes (cpu-local, `atoll plan calibrate`): a grid
  // of (tokens, inputs, outputs, forward+backward efficiency against the peak), every combination
  // of its tokens, inputs and outputs present. Where present, a linear layer's GEMMs take their
  // efficiency from it (trilinear in the logs of the three sizes, clamped at the grid's edges)
  // instead of from gemm_curve, and their operand passes are inside the measurement. Empty: the
  // square curve (GPUs).
  std::vector<std::array<double, 4>> linear_curve;
  // The same grid timed with the operands in the last-level cache instead of memory (only the
  // L2 evicted before each pass): a step whose whole working set fits in the L3 finds its
  // operands there, not in DRAM (`l3_bytes`). Empty: every GEMM as cold as linear_curve.
  std::vector<std::array<double, 4>> linear_curve_l3;
  double l3_bytes = 0;  // last-level cache of a node (cpu-local: sysconf; 0: unknown)
  // Efficiency of a linear layer's GEMMs on `tokens` rows, `inputs` → `outputs` (linear_curve).
  // in_l3: the fraction of the operands' bytes found in the L3 (Prediction::operands_in_l3); the
  // time is the two grids' times mixed in that proportion (harmonic in the efficiencies).
  double linear_efficiency(double tokens, double inputs, double outputs, double in_l3 = 0) const;
  // The engine's grouped expert kernel (cpu::grouped_gemm_forward/backward, one call over a
  // layer's local experts) on the same kind of grid: (rows per expert, inputs, outputs,
  // forward+backward efficiency against the peak), complete. Empty: the experts' GEMMs take the
  // square curve (GPUs: grouped GEMMs run as cuBLAS/CUTLASS GEMMs do).
  std::vector<std::array<double, 4>> expert_curve, expert_curve_l3;
  double expert_efficiency(double rows, double inputs, double outputs, double in_l3 = 0) const;
  // Wall-clock fit of the calibration's all-reduces where the link figures above are CPU time
  // (cpu-local; 0: none). A blocking collective's rank sleeps while its peer wakes and sends:
  // time the wall clock counts and CPU time does not (predict.h, Prediction::sync_wait).
  double intra_wall_bw = 0, intra_wall_latency = 0;
  // The calibration's own all-gather and reduce-scatter fits (cpu-local; 0: not measured, and
  // sequence parallelism's pairs are priced as the all-reduce they replace). CPU time, and the
  // wall clock beside it as for the all-reduce (t = (n−1)·latency + (n−1)/n·bytes/bw).
  double ag_bw = 0, ag_latency = 0, rs_bw = 0, rs_latency = 0;
  double ag_wall_bw = 0, ag_wall_latency = 0, rs_wall_bw = 0, rs_wall_latency = 0;
  // The wait a blocking intra-node collective adds on top of intra_wall_* when the ranks compute
  // between collectives (`atoll bench comm --gap-us`, plan/comm_fit.h GapWaitFit): seconds per
  // collective, plus seconds per second of compute before it. 0, 0: not measured (GPUs, old files).
  double gap_wait_intercept = 0, gap_wait_slope = 0;
  // Bytes per second of CPU time at which released pages fault back in, zero-filled (`atoll plan
  // calibrate`: MADV_DONTNEED on a buffer, then one write per page; 0: not measured).
  double page_fault_bw = 0;
  double gemm_eff_max = 0;  // the curve's ceiling (a measured best matmul efficiency; 0: calibrated curve)
  // Measured ceiling of FP8 GEMMs where it differs (0: as BF16). Hopper: DeepGEMM's "up to 1350+
  // FP8 TFLOPS" with fine-grained scaling (deepseek-ai/open-infra-index README) = 0.682 of 1979.
  double fp8_eff_max = 0;
  // Ceiling of a fused (flash) attention kernel as a fraction of the BF16 peak. FlashAttention-2
  // reaches up to 73% of an A100 (Dao 2023) but only 35% of an H100 (Shah et al. 2024,
  // FlashAttention-3, abstract; FlashAttention-3 itself reaches 75%: set
  // [cluster.device_override] attention_efficiency = 0.75 to model it). Devices without a
  // published figure take the A100's.
  double attention_eff_max = 0.73;
  // Ceiling of its backward pass (0: the forward's × 63/73). FlashAttention-2 reaches up to 73% of
  // an A100's peak in the forward pass and up to 63% in the backward (Dao 2023, §1); where only a
  // forward figure is published (H100: 35%) the backward keeps that ratio.
  double attention_bwd_eff_max = 0;
  double attention_backward_efficiency() const;

  double peak(const std::string& precision) const;  // falls back to the next wider dtype
  double gemm_efficiency(double flops) const;
  // The curve at `precision`: FP8 GEMMs scaled to their own measured ceiling where one is known.
  double gemm_efficiency(double flops, const std::string& precision) const;
  // FLOP/s of a fused attention call of `forward_flops` (attention_curve, else attention_flops).
  double attention_rate(double forward_flops) const;
  // FLOP/s of one cp rank's ring-attention core (ring_attention_curve, else attention_rate).
  double ring_attention_rate(double forward_flops) const;
  // Time of one [m,k]x[k,n] GEMM: the larger of the compute time at the curve's efficiency and
  // the time to stream its operands through memory (a roofline).
  double gemm_time(double m, double n, double k, const std::string& precision, double elem_bytes) const;
};

// The default curve of a GPU: eff(F) = e_max · F / (F + F_half). F_half grows with peak FLOP/s
// (a bigger device needs a bigger GEMM to fill), see hardware.cpp.
// e_max: the device's measured best matmul efficiency (hardware.cpp says where each comes from).
std::vector<std::pair<double, double>> default_gemm_curve(double peak_bf16, double e_max);

const std::vector<Device>& device_catalog();
std::vector<std::string> known_devices();
// Looks a device up by name; "cpu-local" reads the calibration file (see calibration_path()).
Device find_device(const std::string& name);
// $ATOLL_PLAN_CALIBRATION, else ~/.atoll/plan_calibration.json.
std::string calibration_path();
// Builds the cpu-local device from a calibration JSON (written by `atoll plan calibrate`).
Device device_from_calibration(const std::string& path);
// Reads [cluster.device_override] style keys: peak_bf16_tflops, memory_gb, ...
void apply_device_overrides(Device& d, Config& cfg, const std::string& section);

}  // namespace atl::plan
