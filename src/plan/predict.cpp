// Step-time model. Per micro-batch and pipeline stage: every GEMM of the layer is timed with the
// device's efficiency-vs-size curve under a roofline, the element-wise work is timed as memory
// traffic proportional to the activations it produces, the backward pass costs twice the
// forward (Narayanan et al. 2021 §3.4), recompute repeats the forward (full) or the attention
// core (selective, Korthikanti et al. 2022 §5). Pipelines take (m + p - 1) micro-batch slots,
// (m + (p-1)/v) interleaved (Narayanan et al. 2021 §2.2). Collectives use collective.h.
// Outside the kernels, the backward pass's gradient buffers (zero-fill of every stored
// activation's gradient, bias sums, parameter-gradient zeroing) and the optimizer's bytes move at
// memory bandwidth; measured CPU rates (attention, AdamW) and a CPU BLAS's unoverlapped operand
// packing come from `atoll plan calibrate` (docs/plan.md, "Against atoll's own training runs").
// DiLoCo (Douillard et al. 2023) synchronises islands every H inner steps with an
// all-reduce of (optionally compressed) fp32 pseudo-gradients; gossip replaces that all-reduce
// with exchanges between peers.
#include "plan/predict.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

#include "core/error.h"

namespace atl::plan {

// Element-wise kernels move about this many bytes per byte of activation they keep for the
// backward pass (read inputs, write outputs). One global constant, not fitted per experiment.
static constexpr double kTrafficFactor = 2.0;
// Host memory bandwidth used for an offloaded optimizer step.
static constexpr double kHostMemBw = 100e9;
// A fused attention kernel is capped at Device::attention_eff_max: FlashAttention-2's measured
// 50-73% of an A100's peak (Dao 2023, "FlashAttention-2: Faster Attention with Better Parallelism
// and Work Partitioning", abstract), 35% of an H100's (Shah et al. 2024, FlashAttention-3).
// Backward FLOPs of flash attention over its forward (5 matmuls vs 2: QKᵀ is recomputed).
static constexpr double kFlashBackwardRatio = 2.5;
// A causal mask lets the fused kernel skip the tiles above the diagonal, but not half the time:
// the diagonal tiles are computed whole (and masked), and the rows of a causal problem carry
// unequal work. FlashAttention-2 measures "around 1.7-1.8× speedup compared to attention without
// the causal mask" (Dao 2023, §3.1.1): the kernel takes 1/1.75 of the non-causal time, which is
// what this fraction of the non-causal FLOPs at the kernel's rate stands for.
static constexpr double kFlashCausalFraction = 1.0 / 1.75;
// The Triton FlashAttention (flash-attn 1.x's flash_attn_triton.py, which llm-foundry copies and
// runs for attn_impl: triton, the default of its benchmark script, scripts/train/benchmarking/
// submit_benchmarks.py) is slower than FlashAttention-2: "FlashAttention-2 is around 1.3-1.5×
// faster than FlashAttention in Triton in the forward pass and around 2× faster in the backward
// pass" (Dao 2023, §4.1, A100 80GB, head dims 64 and 128, with and without the causal mask). So
// its ceilings are the device's FlashAttention-2 ceilings divided by 1.4 (the middle of
// 1.3-1.5) forward and by 2 backward. Its own header agrees on the shape: "Triton forward is
// generally faster than CUDA forward, while Triton backward is generally slower than CUDA
// backward" (CUDA: FlashAttention 1, whose forward reaches 30-50% of an A100 and backward 25-35%,
// Dao 2023 §1: 73/1.4 = 52% and 63/2 = 32%).
static constexpr double kTritonFlashFwdSlowdown = 1.4;
static constexpr double kTritonFlashBwdSlowdown = 2.0;
// Communication that overlaps compute is not free: its kernels occupy SMs the GEMMs then lack.
// DeepSeek-V3 dedicates 20 of an H800's 132 SMs to communication, enough to saturate InfiniBand
// and NVLink (DeepSeek-AI 2024, §3.2.2). While a hidden collective runs, compute proceeds at
// 1 − f of its speed, so hiding C seconds of communication behind W ≥ C of compute takes W + f·C.
static constexpr double kCommSmShare = 20.0 / 132.0;
// Scale of a collective's time that is charged: all of its exposed part, f of its hidden part.
static double charged(double total, double exposed) {
  return total > 0 ? (exposed + kCommSmShare * std::max(0.0, total - exposed)) / total : 0.0;
}
// PyTorch DDP's default gradient bucket (bucket_cap_mb = 25): buckets are all-reduced as the
// backward pass fills them.
static constexpr double kDdpBucketBytes = 25e6;

CommCost Prediction::comm_total() const {
  CommCost c = tp;
  c += cp, c += ep, c += pp_p2p, c += dp, c += outer, c += control;
  return c;
}

namespace {

struct Timer {
  const Device& d;
  std::string prec;
  double eb;
  double compute = 0, memory = 0;  // split of the roofline time
  double in_l3 = 0;                // share of the measured kernels' operands in the L3 (operands_in_l3)
  // fused: the [m, n] result never reaches memory (flash attention keeps scores on chip).
  void gemm(double m, double n, double k, double times = 1, bool fused = false) {
    if (m <= 0 || n <= 0 || k <= 0 || times <= 0) return;
    double flops = 2 * m * n * k;
    double c = flops / (d.peak(prec) * d.gemm_efficiency(flops, prec));
    double mem = eb * (m * k + k * n + (fused ? 0.0 : m * n)) / d.mem_bw;
    if (!d.gemm_overlaps_memory) compute += c * times, memory += mem * times;
    else if (c >= mem) compute += c * times;
    else memory += mem * times;
  }
  // A linear layer's GEMM on m tokens, k inputs → n outputs: on a device with a measured
  // linear_curve its forward at that efficiency, operand passes included (the backward follows as
  // 2× the forward, which is what the curve's forward+backward efficiency is defined on); else
  // an ordinary GEMM on the square curve.
  void linear(double m, double n, double k, double times = 1) {
    if (d.linear_curve.empty()) return gemm(m, n, k, times);
    if (m <= 0 || n <= 0 || k <= 0 || times <= 0) return;
    compute += times * 2 * m * n * k / (d.peak(prec) * d.linear_efficiency(m, k, n, in_l3));
  }
  // One expert's GEMM of a grouped call over `times` local experts, m rows each: on a device with
  // a measured expert_curve (the engine's grouped kernel, operand traffic inside the measurement)
  // at its efficiency; else an ordinary GEMM on the square curve.
  void expert(double m, double n, double k, double times) {
    if (d.expert_curve.empty()) return gemm(m, n, k, times);
    if (m <= 0 || n <= 0 || k <= 0 || times <= 0) return;
    compute += times * 2 * m * n * k / (d.peak(prec) * d.expert_efficiency(m, k, n, in_l3));
  }
  // Element-wise kernels: at the bandwidth the engine's own kernels were measured to reach where
  // known (on a CPU GELU's tanh and LayerNorm's reductions keep them below STREAM bandwidth).
  void stream(double bytes) { memory += bytes / (d.elementwise_bw > 0 ? d.elementwise_bw : d.mem_bw); }
  // One launch that does `flops` of matrix work and moves `bytes` (a strided-batched GEMM over
  // every head, or one fused attention kernel): its efficiency is that of the whole launch,
  // capped at what such a kernel has been measured to reach.
  void launch(double flops, double bytes, double eff_cap, double times = 1) {
    if (flops <= 0 || times <= 0) return;
    launch_at(flops, bytes, std::min(eff_cap, d.gemm_efficiency(flops, prec)), times);
  }
  void launch_at(double flops, double bytes, double eff, double times = 1) {
    double c = flops / (d.peak(prec) * eff);
    double mem = bytes / d.mem_bw;
    if (!d.gemm_overlaps_memory) compute += c * times, memory += mem * times;
    else if (c >= mem) compute += c * times;
    else memory += mem * times;
  }
  double total() const { return compute + memory; }
};

// Attention core of one layer for one micro-batch, forward (backward folded in as documented):
// every local head of the micro-batch in one launch (cuBLAS strided-batched GEMMs for standard
// attention, one fused kernel for flash), so the efficiency is that of the whole call, not of one
// (sequence, head) product.
// FP8 training keeps attention, the output head and the MoE router in BF16; only the linear
// layers' GEMMs run in FP8 (DeepSeek-AI 2024, DeepSeek-V3 §3.3; NVIDIA Transformer Engine likewise).
std::string nonlinear_precision(const std::string& p) { return p == "fp8" ? "bf16" : p; }

}  // namespace

// Forward + backward time of a flash-attention core over three forward times at efficiency
// e_fwd (the unit the layer's 1 + 2 accounting uses): (1/e_fwd + 2.5/e_bwd) / (3/e_fwd), with
// e_bwd the backward kernel's efficiency, min(its ceiling, the curve's at the call's FLOPs).
double flash_backward_factor(const Device& d, double e_fwd, double fwd_flops, const std::string& precision,
                             double bwd_ceiling) {
  const double cap = bwd_ceiling > 0 ? bwd_ceiling : d.attention_backward_efficiency();
  const double e_bwd = std::min(cap, d.gemm_efficiency(kFlashBackwardRatio * fwd_flops, precision));
  return (1.0 + kFlashBackwardRatio * e_fwd / e_bwd) / 3.0;
}
double flash_forward_ceiling(const Device& d, const ModelSpec& m) {
  return m.attention_kernel == "triton" ? d.attention_eff_max / kTritonFlashFwdSlowdown : d.attention_eff_max;
}
double flash_backward_ceiling(const Device& d, const ModelSpec& m) {
  const double e = d.attention_backward_efficiency();
  return m.attention_kernel == "triton" ? e / kTritonFlashBwdSlowdown : e;
}
double flash_causal_fraction() { return kFlashCausalFraction; }

namespace {

// backward = false: the forward alone (what recompute repeats); true: forward with the backward
// folded in (flash_backward_factor).
void time_attention_core(Timer& out, const ModelSpec& m, const Layout& l, const Device& d, double act_e,
                         bool backward = true) {
  Timer x{d, nonlinear_precision(l.precision), act_e};
  const double t = double(l.tp), b = double(l.micro_batch), s = double(m.seq) / l.cp;
  const double heads_local = b * m.heads / t;
  const double dq = double(m.score_dim()) / m.heads, dv = double(m.value_dim()) / m.heads;
  const double s_keys = double(m.seq);
  // Query-key pairs of one row on this rank: s × s_keys, or with packed documents (document
  // masks) Σ len² over the row's documents, each document causal on its own, split over cp.
  const double pairs = m.attention_sq_len > 0 ? m.attention_sq_len / double(l.cp) : s * s_keys;
  if (m.attention == "flash" && (d.attention_flops > 0 || !d.attention_curve.empty())) {
    // A measured fused-attention kernel (cpu-local): its rate is defined on these FLOPs, for one
    // call over every local head of the micro-batch.
    const double f = heads_local * 2.0 * pairs * (dq + dv);
    x.compute += f / (l.cp > 1 ? d.ring_attention_rate(f) : d.attention_rate(f));
  } else if (m.attention == "flash") {
    // Causal flash attention skips the blocks above the diagonal (1/1.75 of the non-causal time,
    // kFlashCausalFraction); only Q, K, V and O touch memory: the s×s scores and probabilities
    // stay on chip in both products. Its backward recomputes QKᵀ: 5 matmuls against the
    // forward's 2, i.e. 2.5× the forward's FLOPs (Dao 2023, FlashAttention-2 §3.1-3.2), at the
    // backward kernel's own lower ceiling (flash_backward_factor); folded in here because the
    // layer's backward is taken as 2× its forward.
    const double f = kFlashCausalFraction * heads_local * 2.0 * pairs * (dq + dv);
    const double bytes = act_e * heads_local * (s * dq + s_keys * dq + s_keys * dv + s * dv);
    const double e_fwd = std::min(flash_forward_ceiling(d, m), d.gemm_efficiency(f, x.prec));
    x.launch_at(f, bytes, e_fwd, backward ? flash_backward_factor(d, e_fwd, f, x.prec, flash_backward_ceiling(d, m)) : 1.0);
  } else {
    // Megatron-style: baddbmm writes the s×s scores (the softmax's traffic is element-wise work),
    // and bmm reads the probabilities with V.
    x.launch(heads_local * 2.0 * s * s_keys * dq, act_e * heads_local * (s * dq + s_keys * dq + s * s_keys), 1.0);
    x.launch(heads_local * 2.0 * s * s_keys * dv, act_e * heads_local * (s * s_keys + s_keys * dv + s * dv), 1.0);
  }
  out.compute += x.compute, out.memory += x.memory;
}

// Forward time of one transformer layer for one micro-batch on one device.
struct LayerTime {
  // Whole layer; its attention core alone (ring attention hides behind it); that core's forward
  // only (flash folds its backward into the core, and recompute repeats only the forward).
  Timer full, core, core_fwd;
  // Backward-pass gradient-buffer traffic of the layer: zero-filled activation gradients and
  // bias-gradient reads (see bias_grad_bytes).
  double grad_zero = 0, grad_bias = 0;
};

// With biases, the backward pass sums every linear layer's output gradient over the tokens: one
// read of each output (QKV, attention projection, the two MLP matmuls), split over tp.
double bias_grad_bytes(const ModelSpec& m, const Layout& l, double tokens, double act_e, bool moe) {
  if (!m.bias) return 0;
  const double mult = m.ffn_type == "swiglu" ? 2.0 : 1.0;
  const double f = moe ? double(m.expert_ffn) * (m.top_k + m.shared_experts) : double(m.ffn);
  const double widths = m.q_dim() + 2.0 * m.kv_dim() + m.hidden + mult * f + m.hidden;
  return act_e * tokens * widths / l.tp;
}

LayerTime layer_forward(const ModelSpec& m, const Layout& l, const Device& d, bool moe, double act_e, double in_l3) {
  const std::string prec = l.precision;
  const double t = double(l.tp), b = double(l.micro_batch), s = double(m.seq) / l.cp, h = double(m.hidden);
  const double T = b * s;
  LayerTime lt{Timer{d, prec, act_e}, Timer{d, prec, act_e}, Timer{d, prec, act_e}};
  Timer& g = lt.full;
  g.in_l3 = in_l3;
  // Projections.
  if (m.is_mla()) {
    g.linear(T, double(m.attn_params()) / h / t, h);
  } else {
    g.linear(T, (m.q_dim() + 2.0 * m.kv_dim()) / t, h);
    g.linear(T, h, m.value_dim() / t);
  }
  for (Timer* x : {&g, &lt.core}) time_attention_core(*x, m, l, d, act_e);
  time_attention_core(lt.core_fwd, m, l, d, act_e, false);
  // FFN.
  const double mult = m.ffn_type == "swiglu" ? 2.0 : 1.0;
  if (moe) {
    Timer router{d, nonlinear_precision(prec), act_e};
    router.gemm(T, double(m.experts), h);  // the gating GEMM (BF16 under FP8 training)
    g.compute += router.compute, g.memory += router.memory;
    const double f = double(m.expert_ffn);
    if (m.shared_experts > 0) {
      g.linear(T, mult * f * m.shared_experts / t, h);
      g.linear(T, h, f * m.shared_experts / t);
    }
    const double local_experts = double(m.experts) / l.ep;
    const double tokens_per_expert = T * m.top_k * l.ep / m.experts;
    const double split = l.ep > 1 ? 1.0 : t;
    g.expert(tokens_per_expert, mult * f / split, h, local_experts);
    g.expert(tokens_per_expert, h, f / split, local_experts);
  } else {
    g.linear(T, mult * m.ffn / t, h);
    g.linear(T, h, m.ffn / t);
  }
  // Element-wise work: traffic proportional to what the layer stores (Korthikanti's terms).
  ActivationOptions ao{l.tp, l.sp, "none", act_e, moe};
  double act = layer_activation_bytes(m, l.micro_batch, int64_t(s), ao);
  g.stream(kTrafficFactor * act);
  // Every stored activation gets a gradient buffer of its size, zero-filled before the backward
  // kernels accumulate into it: one more write of the bytes the layer keeps.
  lt.grad_zero = act;
  lt.grad_bias = bias_grad_bytes(m, l, T, act_e, moe);
  if (m.attention == "standard") {
    double core_bytes = b * s * m.heads / t * double(m.seq) * (act_e + (m.dropout ? 1 + act_e : 0));
    lt.core.stream(kTrafficFactor * core_bytes);
    lt.core_fwd.stream(kTrafficFactor * core_bytes);
  }
  return lt;
}

std::string fmt_s(double x) { return fmt::format("{:.4g} s", x); }

}  // namespace

// One micro-batch of FSDP / ZeRO-3 over `units` equal units (one per transformer layer): two
// streams, compute and communication (all-gathers and reduce-scatters share the NIC, so they
// queue), with one unit prefetched (PyTorch FSDP's forward_prefetch and BACKWARD_PRE with
// limit_all_gathers: the next unit's all-gather is issued when a unit starts computing). The first
// unit's gather in each pass and the last unit's reduce-scatter have nothing to hide behind; each
// backward reduce-scatter runs while the next unit computes, queued after that unit's prefetch.
// Returns the time the micro-batch takes beyond its compute.
double fsdp_exposed(int64_t units, double fwd, double bwd, double ag, double rs) {
  if (units <= 0) return 0;
  double comp = 0, comm = ag, ready = ag;  // forward: gather unit 0, nothing to overlap yet
  for (int64_t i = 0; i < units; ++i) {
    double start = std::max(comp, ready);
    if (i + 1 < units) comm = std::max(comm, start) + ag, ready = comm;
    comp = start + fwd;
  }
  comm = std::max(comm, comp) + ag, ready = comm;  // backward: the last unit is gathered again
  for (int64_t i = 0; i < units; ++i) {
    double start = std::max(comp, ready);
    if (i + 1 < units) comm = std::max(comm, start) + ag, ready = comm;
    comp = start + bwd;
    comm = std::max(comm, comp) + rs;  // this unit's gradients, behind the next unit's compute
  }
  return std::max(comp, comm) - double(units) * (fwd + bwd);
}

// Bucketed gradient synchronisation overlapped with the backward pass (PyTorch DDP, Megatron's
// overlap_grad_reduce): `n` equal buckets become ready at even intervals over the backward time
// `window`, bucket j at j·window/n, and each takes `c` on the network; the last is ready only when
// the backward ends. Exposed time after the backward: max over j of (j·Δ + (n − j + 1)·c) −
// n·Δ = max(c, n·c − (n − 1)·Δ).
double job_mtbf(const FaultModel& f, int64_t devices) {
  return f.mtbf_s > 0 ? f.mtbf_s : f.device_mtbf_s / double(std::max<int64_t>(1, devices));
}
double checkpoint_interval(const FaultModel& f, int64_t devices) {
  if (!f.active()) return 0;
  return f.interval_s > 0 ? f.interval_s : std::sqrt(2.0 * f.checkpoint_s * job_mtbf(f, devices));
}
double fault_overhead(const FaultModel& f, int64_t devices) {
  if (!f.active()) return 0;
  const double tau = checkpoint_interval(f, devices), M = job_mtbf(f, devices);
  return f.checkpoint_s / tau + (tau / 2 + f.restart_s) / M;
}

double attention_core_time(const ModelSpec& m, const Layout& l, const Device& d) {
  const double act_e = (l.precision == "fp32" || l.precision == "tf32") ? 4.0 : 2.0;
  Timer x{d, l.precision, act_e};
  time_attention_core(x, m, l, d, act_e);
  return x.total();
}

// Idle micro-batch slots of one pipeline step. GPipe and 1F1B: p − 1 (Huang et al. 2019;
// Narayanan et al. 2021 §2.2); interleaved over v chunks: (p − 1)/v (ibid.). ZB-H1 (Qi et al. 2023,
// "Zero Bubble Pipeline Parallelism" §3.1) splits the backward into an input-gradient pass B and
// a weight-gradient pass W and fills the bubble with the W passes: (p − 1)·(T_F + T_B − T_W) in
// place of 1F1B's (p − 1)·(T_F + T_B + T_W). With T_F = T_B = T_W (the backward taken as 2× the
// forward, split evenly, as the engine's ZB-H1 does) that is a third of a micro-batch slot per stage.
double ring_attention_passes(int64_t cp) { return cp > 1 ? 3.0 * double(cp) - 2.0 : 0.0; }

StepProtocol step_protocol_collectives(const ModelSpec& m, const Cluster& c, const Layout& l) {
  StepProtocol r;
  const double act_e = (l.precision == "fp32" || l.precision == "tf32") ? 4.0 : 2.0;
  const double tokens = double(l.micro_batch) * double(m.seq) / l.cp;
  const int64_t dp_inner = l.dp_inner(c.islands);
  constexpr double kScalar = 8.0;  // a double as two floats
  if (l.tp > 1) {
    const Group tg{1, l.tp};
    // The slowest (last) stage holds the head; the embedding too when there is one stage.
    const double ends = l.pp > 1 ? 1.0 : 2.0;
    // With SP the embedding's all-reduce is a reduce-scatter forward and an all-gather backward,
    // the head's an all-gather forward and a reduce-scatter backward (tensor_parallel_ops.cpp).
    r.per_micro_batch = (l.sp ? sp_pair(c, tg, tokens * m.hidden * act_e) : all_reduce(c, tg, tokens * m.hidden * act_e))
                            .scaled(ends);
    r.per_micro_batch += all_reduce(c, tg, 4.0 * tokens);
    r.per_micro_batch += all_reduce(c, tg, 8.0 * tokens);
    const double norms = double(2 * layers_per_stage(m, l) + 1) * double(m.norm_params());
    r.per_step = all_reduce(c, tg, 4.0 * norms);
    r.per_step += all_reduce(c, tg, kScalar).scaled(2.0);
  }
  const int64_t data = l.pp > 1 ? l.tp * l.cp * dp_inner * l.pp : dp_inner * l.cp;
  if (data > 1) r.per_step += all_reduce(c, l.pp > 1 ? Group{1, data} : Group{l.tp, data}, kScalar).scaled(2.0);
  if (l.pp > 1) {
    const Group pg{l.tp * l.cp * dp_inner, l.pp};
    // The loss broadcast from the last stage (pp−1 hops of a ring, like an all-gather) and the
    // stages' squared gradient norms all-gathered.
    r.per_step += all_gather(c, pg, kScalar * l.pp).scaled(2.0);
  }
  return r;
}

double pipeline_bubble_slots(const Layout& l) {
  if (l.pp <= 1) return 0;
  const double p1 = double(l.pp - 1);
  if (l.schedule == "interleaved") return p1 / double(l.virtual_stages);
  if (l.schedule == "zb-h1") return p1 / 3.0;
  return p1;
}

double pipeline_bubble_fraction(const Layout& l) {
  const double idle = pipeline_bubble_slots(l);
  return idle / (double(l.micro_batches()) + idle);
}

MuonCost muon_step_cost(const std::vector<MuonMatrix>& mats, const Device& d, const std::string& precision,
                        double act_e, double owners, bool sharded) {
  MuonCost out;
  out.owners = std::max(1.0, owners);
  double hidden = 0;
  for (const auto& x : mats) {
    if (x.count <= 0 || x.rows <= 0 || x.cols <= 0) continue;
    const double r = std::min(x.rows, x.cols), c = std::max(x.rows, x.cols);
    Timer ns{d, precision, act_e};
    ns.gemm(r, c, r, 5 * 2);  // X·Xᵀ and B·X
    ns.gemm(r, r, r, 5);      // A·A
    out.ns_total += ns.total() * x.count;
    out.ns_largest = std::max(out.ns_largest, ns.total());
    out.flops += 5.0 * (4.0 * r * r * c + 2.0 * r * r * r) * x.count;
    out.matrices += x.count;
    hidden += r * c * x.count;
  }
  out.ns = std::max(out.ns_total / out.owners, out.owners > 1 ? out.ns_largest : 0.0);
  if (out.owners <= 1) out.ns = out.ns_total;
  // Bytes each rank contributes to the exchange (fp32): under ZeRO its 1/N pieces of every matrix
  // (each all-to-all), under DDP the owner's updates, H/N on average (the all-gather's input).
  out.exchange_bytes = out.owners > 1 ? 4.0 * hidden / out.owners * (sharded ? 1.0 : out.owners) : 0.0;
  return out;
}

double ep_copy_bytes(double tokens, double top_k, double hidden, double act_e, int64_t ep) {
  return ep > 1 ? 4.0 * 4.0 * tokens * top_k * hidden * act_e : 0.0;
}

double fsdp_copy_bytes(double unit_params, double grad_e, bool fp32_reduce, bool copy) {
  return unit_params * ((copy ? 2.0 * grad_e : 0.0) + (fp32_reduce ? grad_e + 4.0 : 0.0));
}

double bucketed_exposed(double n, double c, double window) {
  if (n <= 0 || c <= 0) return 0;
  double delta = window / n;
  return std::max(c, n * c - (n - 1) * delta);
}

Prediction predict(const ModelSpec& m, const Cluster& c, const Layout& l, const PredictOptions& opt) {
  m.validate();
  validate_layout(l, m, c);
  Recorder rec(opt.explain);
  Prediction p;
  const Device& d = c.device;
  const double act_e = (l.precision == "fp32" || l.precision == "tf32") ? 4.0 : 2.0;
  const double t = double(l.tp), b = double(l.micro_batch), s_local = double(m.seq) / l.cp, h = double(m.hidden);
  const int64_t n_micro = l.micro_batches();
  const int64_t per_stage = layers_per_stage(m, l);

  p.memory = predict_memory(m, l, c, rec);

  // ---- compute per micro-batch on the slowest stage (the last: it also has the head) ----
  // Where the measured kernels' operands come from: a step whose working set (the device's
  // parameters, gradients, optimizer states and stored activations, times the ranks sharing the
  // node's last-level cache) fits in the L3 finds them there; a larger one, that share of them.
  if (d.l3_bytes > 0 && (!d.linear_curve_l3.empty() || !d.expert_curve_l3.empty())) {
    const auto& mm = p.memory;
    const double ws = (mm.params + mm.grads + mm.optimizer + mm.activations) *
                      double(d.shared_by_node ? std::min<int64_t>(c.devices_per_node, c.world()) : 1);
    p.operands_in_l3 = ws > 0 ? std::min(1.0, d.l3_bytes / ws) : 1.0;
  }
  LayerTime dense = layer_forward(m, l, d, false, act_e, p.operands_in_l3);
  LayerTime moe = m.is_moe() ? layer_forward(m, l, d, true, act_e, p.operands_in_l3) : dense;
  // The heaviest stage holds as many MoE layers as a stage can.
  const int64_t moe_in_stage = std::min<int64_t>(per_stage, m.moe_layers());
  const double n_dense = double(per_stage - moe_in_stage), n_moe = double(moe_in_stage);
  Timer head{d, nonlinear_precision(l.precision), act_e};
  head.in_l3 = p.operands_in_l3;
  head.linear(b * s_local, double(m.vocab) / t, h);
  head.stream(3 * 4.0 * b * s_local * m.vocab / t);  // fp32 softmax / cross-entropy passes
  const double fwd_c = n_dense * dense.full.compute + n_moe * moe.full.compute + head.compute;
  const double fwd_m = n_dense * dense.full.memory + n_moe * moe.full.memory + head.memory;
  double rc_c = 0, rc_m = 0;
  // Recompute repeats forwards only: the attention core at its forward time, not with the flash
  // backward that the layer's forward carries folded in (core − core_fwd; zero for standard).
  const double fold_c = dense.core.compute - dense.core_fwd.compute, fold_m = dense.core.memory - dense.core_fwd.memory;
  if (l.recompute == "full") {
    rc_c = n_dense * (dense.full.compute - fold_c) + n_moe * (moe.full.compute - fold_c);
    rc_m = n_dense * (dense.full.memory - fold_m) + n_moe * (moe.full.memory - fold_m);
  } else if (l.recompute == "selective") {
    rc_c = (n_dense + n_moe) * dense.core_fwd.compute;
    rc_m = (n_dense + n_moe) * dense.core_fwd.memory;
  }
  // Backward: twice the forward (input and weight gradients).
  const double mb_compute = 3 * fwd_c + rc_c, mb_memory = 3 * fwd_m + rc_m;
  // Gradient buffers of the backward pass: the layers' (zero-fill, bias sums) and the fp32
  // logits gradient the cross-entropy writes, at the device's memory bandwidth.
  const double head_grad_bytes = 4.0 * b * s_local * m.vocab / t;
  const double mb_grad_bytes_act = n_dense * dense.grad_zero + n_moe * moe.grad_zero;
  const double mb_grad_bytes_bias = n_dense * dense.grad_bias + n_moe * moe.grad_bias;
  const double mb_grad_bytes = mb_grad_bytes_act + mb_grad_bytes_bias + head_grad_bytes;
  const double mb_grad = mb_grad_bytes / d.mem_bw;

  // ---- per-micro-batch communication inside the model ----
  const double layer_io = b * s_local * h * act_e;  // one [b, s, h] activation
  const double n_tp_colls = (4.0 + (l.recompute == "full" ? 2.0 : 0.0)) * per_stage;
  CommCost tp_mb;
  bool tp_pairs_measured = false;
  if (l.tp > 1) {
    // Megatron: 2 all-reduces forward, 2 backward per layer; SP turns each into an all-gather
    // plus a reduce-scatter of the same total volume.
    // With measured all-gather and reduce-scatter fits (cpu-local), SP's two calls are priced as
    // the calls they are (sp_pair).
    tp_mb = (l.sp ? sp_pair(c, {1, l.tp}, layer_io, &tp_pairs_measured) : all_reduce(c, {1, l.tp}, layer_io))
                .scaled(n_tp_colls);
    if (l.overlap_tp) tp_mb = tp_mb.scaled(charged(1.0, 0.3));  // 30% typically stays exposed
  }
  CommCost cp_mb;
  if (l.cp > 1) {
    // Ring attention: K and V of the local chunk travel cp-1 hops forward, twice that backward,
    // overlapped with the attention core it feeds.
    double kv = b * s_local * 2.0 * m.kv_dim() / t * act_e;
    CommCost ring = send_recv(c, {l.tp, l.cp}, kv).scaled(ring_attention_passes(l.cp) * per_stage);
    double hide = 3 * dense.core.total() * per_stage;
    double exposed = std::max(0.0, ring.total() - hide);
    cp_mb = ring.scaled(charged(ring.total(), exposed));
  }
  CommCost ep_mb, ep_counts;
  // atoll's all-to-all dispatcher pads every (source, destination) chunk to one buffer size of cap
  // rows (parallel/expert_parallel.cpp): first the even share ⌈M/P⌉ of a source's M routed rows,
  // grown to max(need, 1.5·cap) the first time a pair needs more, which any imbalance of the
  // routing does; from then each exchange moves P·cap = 1.5·M rows. cpu-local models atoll;
  // the catalogue's GPUs run engines that send exact counts (Megatron-Core, DeepEP).
  const double ep_pad = d.name == "cpu-local" ? 1.5 : 1.0;
  if (l.ep > 1 && moe_in_stage > 0) {
    // Dispatch and combine, forward and backward: 4 all-to-alls of the routed tokens (top_k copies
    // of each). With node-limited routing a token crosses the network once per destination node
    // (at most route_nodes of them) and is copied to its experts inside the node.
    const Group eg{l.tp * l.cp, l.ep};
    ep_mb = all_to_all(c, eg, ep_pad * b * s_local * h * act_e * m.top_k);
    if (m.route_nodes > 0) {
      CommCost net = all_to_all(c, eg, b * s_local * h * act_e * std::min(m.top_k, m.route_nodes));
      ep_mb.t[1] = net.t[1], ep_mb.t[2] = net.t[2];
    }
    ep_mb = ep_mb.scaled(4.0 * moe_in_stage);
    // Before its dispatch each MoE layer all-gathers every rank's rows per expert (E int32 each,
    // exchange_counts): one latency-bound blocking call per layer and micro-batch, at the
    // calibration's all-gather fit where there is one.
    ep_counts = ring_phase(c, eg, 4.0 * double(m.experts) * double(l.ep), true).scaled(moe_in_stage);
    ep_mb += ep_counts;
    if (l.overlap_ep) {
      // Overlapped with the compute of the micro-batch running beside it (DualPipe pairs a forward
      // and a backward chunk): only what outlasts that compute stays exposed.
      const double hide = mb_compute + mb_memory;
      const double exposed = std::max(0.0, ep_mb.total() - hide);
      ep_mb = ep_mb.scaled(charged(ep_mb.total(), exposed));
    }
  }
  // ZeRO-3 / FSDP: every micro-batch the unsharded gradients of every unit are copied into the flat
  // buffer the reduce-scatter reads, and cast to fp32 first when the reduction runs in fp32
  // (fsdp_copy_bytes). These copies are the size of the unit, not of the shard.
  const StateBytes sb = state_bytes(l.precision, l.optimizer);
  const double params_local = p.memory.params_per_device;
  const bool fp32_reduce = l.reduce_dtype == "fp32" && sb.grad < 4;
  const bool grad_copy = l.fsdp_grad_copy < 0 ? d.name != "cpu-local" : l.fsdp_grad_copy > 0;
  const double mb_fsdp = l.zero >= 3 ? fsdp_copy_bytes(params_local, sb.grad, fp32_reduce, grad_copy) / d.mem_bw : 0.0;
  // The pages of what a ZeRO-3 rank does not own, faulted back in (Prediction::page_faults).
  const double z3_shards = double(l.hsdp ? l.hsdp : l.dp_inner(c.islands) * l.cp);
  const double mb_fault_bytes = l.zero >= 3 && z3_shards > 1 && d.page_fault_bw > 0
                                    ? (2.0 * sb.weight + sb.grad) * params_local * (1.0 - 1.0 / z3_shards)
                                    : 0.0;
  const double mb_faults = mb_fault_bytes > 0 ? mb_fault_bytes / d.page_fault_bw : 0.0;
  // Expert parallelism's pack/unpack copies (ep_copy_bytes), plain memory streams.
  const double mb_ep_copies =
      l.ep > 1 && moe_in_stage > 0 ? n_moe * ep_copy_bytes(b * s_local, double(m.top_k), h, act_e, l.ep) / d.mem_bw : 0.0;
  const StepProtocol proto = step_protocol_collectives(m, c, l);
  const double mb_time = mb_compute + mb_memory + mb_grad + mb_fsdp + mb_faults + mb_ep_copies + tp_mb.total() + cp_mb.total() + ep_mb.total() +
                         proto.per_micro_batch.total();

  // ---- pipeline ----
  const double v = l.schedule == "interleaved" ? double(l.virtual_stages) : 1.0;
  const double slots = double(n_micro) + pipeline_bubble_slots(l);
  const double pipe_time = slots * mb_time;
  p.bubble = (slots - n_micro) * mb_time;
  const int64_t dp_inner = l.dp_inner(c.islands);
  if (l.pp > 1) {
    // Activations forward, gradients backward, split over tp (scatter/gather, Narayanan §4.1).
    double bytes = layer_io / t;
    const double sends = 2.0 * v * (double(n_micro) + l.pp - 1);
    const CommCost one = send_recv(c, {l.tp * l.cp * dp_inner, l.pp}, bytes);
    p.pp_p2p = one.scaled(sends);
    if (l.overlap_pp) {
      // Asynchronous sends: each runs beside the next chunk's compute, at least a forward of one
      // model chunk (a third of a micro-batch slot over v chunks); only what outlasts it is exposed.
      const double exposed = sends * std::max(0.0, one.total() - mb_time / (3.0 * v));
      p.pp_p2p = p.pp_p2p.scaled(charged(p.pp_p2p.total(), exposed));
    }
  }
  p.compute = n_micro * mb_compute;
  p.memory_bound = n_micro * mb_memory;
  p.recompute = n_micro * (rc_c + rc_m);
  // Plus zeroing the parameter gradients the device holds, once per step.
  const double param_zero = p.memory.grads / d.mem_bw;
  // Gradient accumulation: every micro-batch after the first adds its weight gradients into the
  // gradient buffer the device holds (PyTorch's AccumulateGrad, Megatron's main_grad.add_): read
  // the buffer, read the new gradient, write the buffer, 3 × the gradient bytes per parameter. A
  // GEMM's wgrad does 6 FLOPs per parameter and token, so this costs about a 1/(tokens per
  // micro-batch) share of the arithmetic intensity: ~5% of the GEMM time at 2048 tokens on an A100.
  const double accum_bytes = double(std::max<int64_t>(0, n_micro - 1)) * 3.0 * p.memory.grads;
  const double grad_accum = accum_bytes / d.mem_bw;
  p.grad_buffers = n_micro * mb_grad + param_zero + grad_accum;
  p.fsdp_copies = n_micro * mb_fsdp;
  p.page_faults = n_micro * mb_faults;
  p.ep_copies = n_micro * mb_ep_copies;
  p.tp = tp_mb.scaled(double(n_micro));
  p.cp = cp_mb.scaled(double(n_micro));
  p.ep = ep_mb.scaled(double(n_micro));
  p.control = proto.per_micro_batch.scaled(double(n_micro));
  p.control += proto.per_step;

  // ---- data-parallel gradient synchronisation ----
  const Group dp_group{l.tp, dp_inner * l.cp};
  // The reduction's bytes: the gradients' own, or 4 per parameter when reduced in fp32.
  const double grad_bytes = params_local * (fp32_reduce ? 4.0 : sb.grad), weight_bytes = params_local * sb.weight;
  CommCost dp_cost;
  // Backward time of one micro-batch on this stage: what the gradient traffic can hide behind.
  const double mb_fwd = fwd_c + fwd_m + (l.tp > 1 ? tp_mb.total() / n_tp_colls * 2.0 * per_stage : 0.0);
  const double mb_bwd = std::max(0.0, mb_time - mb_fwd);
  double n_buckets = 0, fsdp_units = 0;
  if (l.zero >= 3) {
    // FSDP: every unit (a transformer layer) is all-gathered for its forward and again for its
    // backward, and its gradients reduce-scattered, in every micro-batch (fsdp_exposed).
    const Group shard = l.hsdp ? Group{l.tp, l.hsdp} : dp_group;
    const double units = double(std::max<int64_t>(1, per_stage));
    fsdp_units = units;
    CommCost ag = all_gather(c, shard, weight_bytes / units);
    CommCost rs = reduce_scatter(c, shard, grad_bytes / units);
    // HSDP: each unit's shard of gradients is all-reduced across the replicas right after its
    // reduce-scatter, on the same stream.
    if (l.hsdp && dp_inner * l.cp / l.hsdp > 1)
      rs += all_reduce(c, {l.tp * l.hsdp, dp_inner * l.cp / l.hsdp}, grad_bytes / units / l.hsdp);
    CommCost per_mb = ag.scaled(2.0 * units);
    per_mb += rs.scaled(units);
    double exposed = fsdp_exposed(int64_t(units), mb_fwd / units, mb_bwd / units, ag.total(), rs.total());
    // At every instant one of the two streams is busy, so the exposed time never exceeds the
    // communication's own.
    dp_cost = per_mb.scaled(n_micro * charged(per_mb.total(), std::min(exposed, per_mb.total())));
  } else {
    // Gradients: all-reduced (ZeRO-1/2: reduce-scattered), in buckets as the last micro-batch's
    // backward fills them when overlap_dp, else in one coalesced buffer after it. ZeRO-1/2 then
    // all-gather the updated weights after the optimizer step, with nothing left to overlap.
    CommCost grads, weights;
    n_buckets = l.overlap_dp ? std::max(1.0, std::ceil(grad_bytes / kDdpBucketBytes)) : 1.0;
    const double bucket = grad_bytes / n_buckets;
    if (l.hsdp) {
      grads = reduce_scatter(c, {l.tp, l.hsdp}, bucket);
      grads += all_reduce(c, {l.tp * l.hsdp, dp_inner * l.cp / l.hsdp}, bucket / l.hsdp);
      weights = all_gather(c, {l.tp, l.hsdp}, weight_bytes);
    } else if (l.zero >= 1) {
      grads = reduce_scatter(c, dp_group, bucket);
      weights = all_gather(c, dp_group, weight_bytes);
    } else {
      grads = all_reduce(c, dp_group, bucket);
    }
    double exposed = l.overlap_dp ? bucketed_exposed(n_buckets, grads.total(), mb_bwd) : n_buckets * grads.total();
    CommCost all = grads.scaled(n_buckets);
    dp_cost = all.scaled(charged(all.total(), exposed));
    dp_cost += weights;
  }
  p.dp = dp_cost;

  // ---- optimizer step ----
  const int64_t nd = l.hsdp ? l.hsdp : dp_inner * l.cp;
  const double opt_params = l.zero >= 1 ? params_local / nd : params_local;
  // Adam-class: read and write the optimizer state (master weights, moments), read the gradient
  // for the update and once more for the global gradient norm (clipping), write the weights; in
  // fp32 the weights are their own master copy, so they are read as well.
  const bool own_master = l.precision == "fp32" || l.precision == "tf32";
  const double bytes_per_param = sb.optim * 2 + 2 * sb.grad + sb.weight * (own_master ? 2 : 1);
  double opt_time = opt_params * bytes_per_param / (l.offload == "optimizer" ? kHostMemBw : d.mem_bw);
  // A measured update rate (cpu-local) bounds it where the arithmetic (division, square root per
  // parameter) is slower than streaming the bytes.
  const bool rate_bound = l.optimizer == "adam" && l.offload != "optimizer" && d.optimizer_params_per_s > 0 &&
                          opt_params / d.optimizer_params_per_s > opt_time;
  if (rate_bound) opt_time = opt_params / d.optimizer_params_per_s;
  MuonCost muon;
  if (l.optimizer == "muon") {
    // Distributed Muon (DMuon): every hidden matrix has one owner, which alone runs its
    // Newton–Schulz; owners are balanced longest-first over the data-parallel group (the engine's
    // MuonOwner under DDP, ShardedMuon under ZeRO), tp shards each matrix further.
    const double lps = double(per_stage);
    const double f = m.is_moe() ? double(m.expert_ffn) : double(m.ffn);
    const double ffn_mats = (m.ffn_type == "swiglu" ? 3.0 : 2.0) *
                            (m.is_moe() ? double(m.experts) / l.ep * (l.ep > 1 ? t : 1.0) + m.shared_experts : 1.0);
    // [rows, cols, count] per kind, tp-split along the wider side.
    const std::vector<MuonMatrix> mats = {
        {h, double(m.q_dim() + 2 * m.kv_dim()) / t, lps},
        {double(m.value_dim()) / t, h, lps},
        {h, f / (m.is_moe() && l.ep > 1 ? 1.0 : t), lps * ffn_mats},
    };
    muon = muon_step_cost(mats, d, nonlinear_precision(l.precision), act_e,
                          double(l.hsdp ? l.hsdp : dp_inner * l.cp), l.zero >= 1);
    // The exchange: ZeRO, two all-to-alls of each rank's fp32 pieces (to the owners and back);
    // DDP, one all-gather of the owners' fp32 updates (muon_step_cost: bytes per rank).
    const Group g{l.tp, l.hsdp ? l.hsdp : dp_inner * l.cp};
    if (g.size > 1) {
      muon.exchange = l.zero >= 1 ? all_to_all(c, g, muon.exchange_bytes).scaled(2.0).total()
                                  : all_gather(c, g, muon.exchange_bytes).total();
    }
    opt_time += muon.ns + muon.exchange;
  }
  p.optimizer = opt_time;
  if (l.offload == "optimizer")
    p.offload = (opt_params * sb.grad + opt_params * sb.weight) / d.host_bw;  // grads down, weights up

  // ---- decentralized: DiLoCo outer sync / gossip across islands ----
  if (l.diloco_h > 0 || l.gossip_peers > 0) {
    double h_steps = double(std::max<int64_t>(1, l.diloco_h));
    double pg_bytes = 4.0 * params_local * l.diloco_compression;  // fp32 pseudo-gradient
    CommCost sync;
    if (l.gossip_peers > 0) {
      // Each island exchanges one full model copy with each of its peers over its WAN link.
      double model_bytes = 4.0 * double(m.total_params()) * l.diloco_compression;
      sync.t[2] = l.gossip_peers * (model_bytes / c.wan.bw + c.wan.latency);
    } else {
      // Replicas within an island hold the same pseudo-gradient: reduce-scatter it inside the
      // island, all-reduce each shard across islands, all-gather it back.
      Group inner{l.tp, dp_inner * l.cp}, across{c.devices_per_island(), c.islands};
      sync = reduce_scatter(c, inner, pg_bytes);
      sync += all_reduce(c, across, pg_bytes / double(dp_inner * l.cp));
      sync += all_gather(c, inner, pg_bytes);
    }
    p.outer = sync.scaled(1.0 / h_steps);
  }

  p.step = pipe_time + param_zero + grad_accum + p.pp_p2p.total() + p.dp.total() + p.optimizer + p.offload + p.outer.total() +
           proto.per_step.total();

  // ---- the wall clock's share of blocking collectives (cpu-local, CPU-timed links) ----
  // The calibration fitted the same 2-rank all-reduces twice: by CPU time (the links above) and
  // by the wall clock, which also counts a rank asleep in the collective until its peer has woken
  // and sent. Pricing every collective of the step with the wall-clock fit (the same formulas,
  // overlaps and counts) and taking the difference gives that sleep; a tp step's tens of
  // latency-bound collectives are where it shows. Only where the intra-node link is the
  // calibrated one (not overridden in [cluster]).
  if (d.intra_wall_bw > 0 && c.intra.bw == d.intra_bw && c.intra.latency == d.intra_latency) {
    Cluster cw = c;
    cw.intra = {d.intra_wall_bw, d.intra_wall_latency};
    cw.device.intra_wall_bw = 0;  // priced once, by the wall clock
    // The wall pass takes the all-gather and reduce-scatter fits' wall figures too (ring_phase
    // checks the link against the device's).
    cw.device.intra_bw = cw.intra.bw, cw.device.intra_latency = cw.intra.latency;
    if (d.ag_wall_bw > 0) cw.device.ag_bw = d.ag_wall_bw, cw.device.ag_latency = d.ag_wall_latency;
    if (d.rs_wall_bw > 0) cw.device.rs_bw = d.rs_wall_bw, cw.device.rs_latency = d.rs_wall_latency;
    PredictOptions quiet = opt;
    quiet.explain = false;
    p.sync_wait = std::max(0.0, predict(m, cw, l, quiet).step - p.step);
    // Back to back, the calibration's ranks arrive at each all-reduce together; in a step every
    // model-parallel collective follows a stretch of compute, and the rank done first sleeps out
    // its peer's lateness and is woken (`atoll bench comm --gap-us`, plan/comm_fit.h): per such
    // collective intercept + slope × the compute before it. Counted on the blocking points inside
    // a micro-batch, as the engine issues them: tp's per layer (4, or 8 with sp: each all-reduce an
    // all-gather and a reduce-scatter) and the ends' and loss's (step_protocol_collectives), cp's
    // ring hops, ep's four exchanges per MoE layer; on an intra-node group only.
    if (d.gap_wait_intercept > 0 || d.gap_wait_slope > 0) {
      double points = 0;
      if (l.tp > 1 && group_level(c, {1, l.tp}) == Level::intra_node)
        points += (n_tp_colls + (l.pp > 1 ? 1.0 : 2.0)) * (l.sp ? 2.0 : 1.0) + 2.0;
      if (l.cp > 1 && group_level(c, {l.tp, l.cp}) == Level::intra_node) points += ring_attention_passes(l.cp) * per_stage;
      if (l.ep > 1 && moe_in_stage > 0 && group_level(c, {l.tp * l.cp, l.ep}) == Level::intra_node) points += 5.0 * n_moe;
      if (points > 0) {
        const double work = mb_compute + mb_memory + mb_grad + mb_fsdp + mb_faults + mb_ep_copies;
        p.gap_wait_points = points * double(n_micro);
        p.gap_wait_compute = work / points;
        p.gap_wait = p.gap_wait_points * (d.gap_wait_intercept + d.gap_wait_slope * p.gap_wait_compute);
        p.sync_wait += p.gap_wait;
      }
    }
    p.step += p.sync_wait;
  }

  // ---- throughput, utilisation, time and cost ----
  p.tokens_per_step = double(l.batch()) * m.seq;
  p.tokens_per_s = p.tokens_per_step / p.step;
  p.tokens_per_s_device = p.tokens_per_s / c.world();
  p.tokens_per_s_island = p.tokens_per_s / c.islands;
  p.model_flops_per_token = m.train_flops_per_token("none");
  p.hardware_flops_per_token = m.train_flops_per_token(l.recompute);
  const double peak = d.peak(l.precision);
  p.achieved_flops_per_device = p.model_flops_per_token * p.tokens_per_s_device;
  p.mfu = p.achieved_flops_per_device / peak;
  p.hfu = p.hardware_flops_per_token * p.tokens_per_s_device / peak;
  p.train_tokens = opt.train_tokens;
  p.train_seconds = opt.train_tokens / p.tokens_per_s;
  if (opt.fault.active()) {
    p.checkpoint_interval = checkpoint_interval(opt.fault, c.world());
    p.fault_overhead = fault_overhead(opt.fault, c.world());
    ATOLL_CHECK(p.fault_overhead < 1,
                "run: checkpoints of {:.4g} s every {:.4g} s against a job MTBF of {:.4g} s (restart {:.4g} s) lose all "
                "the wall time ({:.3g}); checkpoint faster or less often", opt.fault.checkpoint_s, p.checkpoint_interval,
                job_mtbf(opt.fault, c.world()), opt.fault.restart_s, p.fault_overhead);
    p.train_seconds /= 1.0 - p.fault_overhead;
  }
  p.price_per_hour = c.price_per_hour();
  p.train_cost = p.train_seconds / 3600.0 * p.price_per_hour;

  // ---- bottleneck: the largest share of the step ----
  {
    CommCost comm = p.comm_total();
    std::vector<std::pair<double, std::string>> parts = {
        {p.compute, "compute-bound (GEMMs)"},
        {p.memory_bound + p.grad_buffers + p.fsdp_copies + p.page_faults + p.ep_copies + p.optimizer + p.offload,
         "memory-bound (element-wise kernels, gradient buffers, optimizer)"},
        {p.bubble, "pipeline-bubble-bound"},
    };
    for (int lv = 0; lv < 3; ++lv)
      parts.push_back({comm.t[lv], fmt::format("communication-bound ({})", level_name(Level(lv)))});
    auto best = std::max_element(parts.begin(), parts.end());
    p.bottleneck = fmt::format("{} — {:.0f}% of the step", best->second, 100.0 * best->first / p.step);
  }

  if (rec.explaining()) {
    auto lv = [](const CommCost& x) {
      return fmt::format("intra-node {:.4g} s + inter-node {:.4g} s + inter-island {:.4g} s", x.t[0], x.t[1], x.t[2]);
    };
    rec.add("time.compute", p.compute, "s", [&] {
      std::string attn;
      if (m.attention == "flash" && (d.attention_flops > 0 || !d.attention_curve.empty())) {
        double f = b * m.heads / t * 2.0 * s_local * double(m.seq) * double(m.score_dim() + m.value_dim()) / m.heads;
        if (l.cp > 1)
          attn = fmt::format("; attention cores ({:.4g} forward FLOPs per layer) at the measured ring-attention block "
                             "rate {:.4g} GFLOP/s{}", f, d.ring_attention_rate(f) / 1e9,
                             d.ring_attention_curve.empty() ? " (not calibrated: the fused kernel's)" : "");
        else
          attn = fmt::format("; attention cores ({:.4g} forward FLOPs per layer) at the measured fused-attention rate "
                             "{:.4g} GFLOP/s", f, d.attention_rate(f) / 1e9);
      } else {
        double f = b * m.heads / t * 2.0 * s_local * double(m.seq) * double(m.score_dim() + m.value_dim()) / m.heads;
        if (m.attention == "flash") f *= kFlashCausalFraction;
        const std::string ap = nonlinear_precision(l.precision);
        const double cap_f = flash_forward_ceiling(d, m), cap_b = flash_backward_ceiling(d, m);
        const double e_fwd = std::min(cap_f, d.gemm_efficiency(f, ap));
        const std::string kernel =
            m.attention_kernel == "triton"
                ? fmt::format("Triton FlashAttention: the device's FlashAttention-2 ceilings {:g} / {:.3g} ÷ 1.4 "
                              "forward, ÷ 2 backward (Dao 2023 §4.1)",
                              d.attention_eff_max, d.attention_backward_efficiency())
                : std::string("FlashAttention-2: 73% / 63% of an A100");
        attn = fmt::format(
            "; attention: all {} local heads in one launch ({:.4g} FLOPs, eff {:.3f}{})", b * m.heads / t, f,
            m.attention == "flash" ? e_fwd : d.gemm_efficiency(f / 2, ap),
            m.attention == "flash"
                ? fmt::format(", flash: causal = 1/1.75 of the non-causal time (FlashAttention-2's 1.7-1.8× causal "
                              "speed-up), forward capped at {:.3g}, backward (2.5× the forward's FLOPs) at {:.3g} "
                              "({}), so forward+backward = {:.3f} × 3 forward times, recompute 1 forward time; "
                              "Q/K/V/O traffic only",
                              cap_f, std::min(cap_b, d.gemm_efficiency(2.5 * f, ap)), kernel,
                              flash_backward_factor(d, e_fwd, f, ap, cap_b))
                : std::string(", standard: s×s scores written and read"));
      }
      std::string stages = l.pp > 1 && m.layers % (l.pp * int64_t(v)) != 0
                               ? fmt::format(" (uneven stages: the heaviest holds {} of {} layers)", per_stage, m.layers)
                               : std::string();
      std::string ceiling = d.gemm_eff_max > 0 ? fmt::format("; curve ceiling e_max={:.3f} ({})", d.gemm_eff_max, d.note)
                                               : std::string("; calibrated curve");
      std::string linears;
      if (!d.linear_curve.empty()) {
        const double T = b * s_local;
        linears = fmt::format("; linear layers on the measured token-major curve ({} shapes): e.g. QKV {}×{}→{} at eff "
                              "{:.3f}, MLP down {}×{}→{} at {:.3f} (operand passes included)",
                              d.linear_curve.size(), T, h, (m.q_dim() + 2.0 * m.kv_dim()) / t,
                              d.linear_efficiency(T, h, (m.q_dim() + 2.0 * m.kv_dim()) / t, p.operands_in_l3), T,
                              double(m.ffn) / t, h, d.linear_efficiency(T, double(m.ffn) / t, h, p.operands_in_l3));
        if (!d.linear_curve_l3.empty())
          linears += fmt::format(", {:.0f}% of the operands in the L3 ({:.4g} MB; the L3-resident grid's share)",
                                 100 * p.operands_in_l3, d.l3_bytes / 1e6);
      }
      if (!d.expert_curve.empty() && m.is_moe()) {
        const double rows = b * s_local * m.top_k * l.ep / m.experts, f = double(m.expert_ffn) / (l.ep > 1 ? 1.0 : t);
        const double up = (m.ffn_type == "swiglu" ? 2.0 : 1.0) * f;
        linears += fmt::format("; experts on the grouped kernel's measured curve ({} shapes): {} local experts × "
                               "{:.4g} rows, {}→{} at eff {:.3f}, {}→{} at {:.3f}", d.expert_curve.size(),
                               double(m.experts) / l.ep, rows, h, up, d.expert_efficiency(rows, h, up, p.operands_in_l3),
                               f, h, d.expert_efficiency(rows, f, h, p.operands_in_l3));
      }
      return fmt::format("m={} micro-batches × (3×forward + recompute) GEMM time of {} layers/stage (+head){}; each "
                         "GEMM 2mnk / (peak {:.4g} TFLOP/s × eff(2mnk)), e.g. eff(1e11)={:.3f}{}{}{}",
                         n_micro, per_stage, stages, peak / 1e12, d.gemm_efficiency(1e11, l.precision), ceiling, linears,
                         attn);
    });
    rec.add("time.memory_bound", p.memory_bound, "s", [&] {
      return fmt::format("m × 3 × ({:.1f} × activation bytes of the stage's layers + 12·b·s·V/t softmax/"
                         "cross-entropy bytes) / {} {:.4g} GB/s (+ {} at {:.4g} GB/s){}",
                         kTrafficFactor, d.elementwise_bw > 0 ? "element-wise bandwidth" : "memory bandwidth",
                         (d.elementwise_bw > 0 ? d.elementwise_bw : d.mem_bw) / 1e9,
                         d.gemm_overlaps_memory ? "memory-bound GEMMs"
                                                : "every GEMM's operand passes (packing, not overlapped on this device)",
                         d.mem_bw / 1e9,
                         d.mem_bw_efficiency < 1
                             ? fmt::format("; memory bandwidth = {:.3g} × datasheet {:.4g} GB/s (the best kernels reach "
                                           "~90% of HBM: NVIDIA forum thread 339083)",
                                           d.mem_bw_efficiency, d.mem_bw / d.mem_bw_efficiency / 1e9)
                             : std::string());
    });
    rec.add("time.grad_buffers", p.grad_buffers, "s", [&] {
      return fmt::format("(m={} × ({:.4g} MB zero-filled activation gradients + {:.4g} MB bias-gradient reads + {:.4g} MB "
                         "fp32 logits gradient) + {:.4g} MB parameter gradients zeroed + (m−1) × 3 × {:.4g} MB gradient "
                         "accumulation) / memory bandwidth {:.4g} GB/s",
                         n_micro, mb_grad_bytes_act / 1e6, mb_grad_bytes_bias / 1e6, head_grad_bytes / 1e6,
                         p.memory.grads / 1e6, p.memory.grads / 1e6, d.mem_bw / 1e9);
    });
    rec.add("time.page_faults", p.page_faults, "s", [&] {
      if (p.page_faults <= 0) return std::string("none: no ZeRO-3 over several ranks, or no measured page-fault rate");
      return fmt::format("m={} × {:.4g} MB of non-owned pages (values twice, gradients once: (2×{} + {}) B × {:.4g} "
                         "params × (1 − 1/{})) faulted back in, zero-filled, at the calibrated {:.4g} GB/s",
                         n_micro, mb_fault_bytes / 1e6, sb.weight, sb.grad, params_local, z3_shards,
                         d.page_fault_bw / 1e9);
    });
    rec.add("time.fsdp_copies", p.fsdp_copies, "s", [&] {
      if (l.zero < 3) return std::string("no ZeRO-3/FSDP: gradients are reduced from the buffers they accumulate in");
      return fmt::format("m={} × {:.4g} params × ({}) B / memory bandwidth {:.4g} GB/s: every micro-batch {}{}",
                         n_micro, params_local, fsdp_copy_bytes(1.0, sb.grad, fp32_reduce, grad_copy), d.mem_bw / 1e9,
                         grad_copy ? fmt::format("each unit's unsharded gradients are copied into the reduce-scatter's "
                                                 "flat input (2×{} B: FSDP's flat-parameter gradient, FSDP2's chunk-cat "
                                                 "copy-in, DeepSpeed's IPG bucket)", sb.grad)
                                   : std::string("no gradient copy (fsdp_grad_copy off: they accumulate in the flat "
                                                 "buffer the reduce-scatter reads, as in atoll)"),
                         fp32_reduce ? fmt::format(" and cast to fp32 for an fp32 reduction ({} B read + 4 B written; "
                                                   "the reduce-scatter then moves 4 B per parameter)", sb.grad)
                                     : std::string());
    });
    rec.add("time.ep_copies", p.ep_copies, "s", [&] {
      return fmt::format("m × {} MoE layers × 4 exchanges × pack + unpack (read + write) of b·s·top_k = {:g} routed "
                         "rows × {:g} × {:g} B at memory bandwidth {:.4g} GB/s", n_moe, b * s_local * m.top_k, h,
                         act_e, d.mem_bw / 1e9);
    });
    rec.add("time.recompute", p.recompute, "s", [&] { return fmt::format("recompute = {} (included above)", l.recompute); });
    rec.add("time.tp", p.tp.total(), "s", [&] {
      const std::string pairs =
          tp_pairs_measured ? fmt::format(" (sp: each an all-gather at the calibration's {:.4g} GB/s + {:.4g} us and a "
                                          "reduce-scatter at {:.4g} GB/s + {:.4g} us, two calls)",
                                          d.ag_bw / 1e9, 1e6 * d.ag_latency, d.rs_bw / 1e9, 1e6 * d.rs_latency)
          : l.sp ? std::string(" (sp: each an all-gather and a reduce-scatter, priced as the all-reduce)")
                 : std::string();
      return fmt::format("m × {} all-reduces of b·s·h·{}B = {:.4g} MB over tp={} ({}){}{}: {}", n_tp_colls, act_e,
                         layer_io / 1e6, l.tp, level_name(group_level(c, {1, l.tp})), pairs,
                         l.overlap_tp ? " ×0.3 overlapped" : "", lv(p.tp));
    });
    rec.add("time.cp", p.cp.total(), "s", [&] {
      return fmt::format("{} ring attention K/V passes per layer (3·cp−2) not hidden by the attention core: {}",
                         ring_attention_passes(l.cp), lv(p.cp));
    });
    rec.add("time.control", p.control.total(), "s", [&] {
      return "the step's small collectives (tp: embedding/head ends and cross-entropy per micro-batch; per step the "
             "mean loss, stop flag, gradient norm, replicated-parameter sums): " + lv(p.control);
    });
    rec.add("time.ep", p.ep.total(), "s", [&] {
      return fmt::format("m × 4 all-to-alls × {} MoE layers of {}b·s·h·top_k bytes over ep={}{}{}; plus per layer the "
                         "all-gather of the per-expert row counts ({} B, {:.4g} s in all): {}", moe_in_stage,
                         ep_pad != 1.0 ? fmt::format("{:g} × (atoll's chunks padded to 1.5× the even share) ", ep_pad) : "",
                         l.ep,
                         m.route_nodes > 0 ? fmt::format(", across nodes min(top_k, route_nodes={}) copies per token",
                                                         m.route_nodes) : "",
                         l.overlap_ep ? ", overlapped with the paired micro-batch's compute (exposed: the excess)" : "",
                         4 * m.experts * l.ep, double(n_micro) * ep_counts.total(), lv(p.ep));
    });
    rec.add("time.pp_p2p", p.pp_p2p.total(), "s", [&] {
      return fmt::format("2·v·(m+p−1) sends of b·s·h/t = {:.4g} MB{}: {}", layer_io / t / 1e6,
                         l.overlap_pp ? " (overlap_pp: asynchronous, each beside a chunk's forward; exposed part in full, "
                                        "20/132 of the hidden part)"
                                      : "",
                         lv(p.pp_p2p));
    });
    rec.add("time.bubble", p.bubble, "s", [&] {
      return fmt::format("{} idle slots × micro-batch time {} ({}: (p−1){})", pipeline_bubble_slots(l), fmt_s(mb_time),
                         l.schedule, l.schedule == "interleaved" ? "/v" : l.schedule == "zb-h1" ? "/3, W passes fill the rest" : "");
    });
    rec.add("time.dp", p.dp.total(), "s", [&] {
      std::string how;
      if (l.zero >= 3)
        how = fmt::format("FSDP per unit and micro-batch: {} units × (2 all-gathers of {:.4g} MB + reduce-scatter of "
                          "{:.4g} MB) per micro-batch, ring latency per step at each level crossed; one unit "
                          "prefetched, first gathers and last reduce-scatter exposed, each reduce-scatter behind the "
                          "next unit's compute (backward {} per micro-batch); m={} micro-batches",
                          fsdp_units, weight_bytes / fsdp_units / 1e6, grad_bytes / fsdp_units / 1e6, fmt_s(mb_bwd),
                          n_micro);
      else if (l.overlap_dp)
        how = fmt::format("{} buckets of {:.4g} MB {} as the last backward ({}) fills them: exposed = max(c, n·c − "
                          "(n−1)·backward/n){}",
                          n_buckets, grad_bytes / n_buckets / 1e6, l.zero ? "reduce-scattered" : "all-reduced",
                          fmt_s(mb_bwd), l.zero ? " + all-gather of the updated weights" : "");
      else
        how = fmt::format("one coalesced {} of {:.4g} MB after the backward pass{}", l.zero ? "reduce-scatter" : "all-reduce",
                          grad_bytes / 1e6, l.zero ? " + all-gather of the updated weights" : "");
      return fmt::format("{} over dp group of {} ({}): {}", how, dp_inner * l.cp, level_name(group_level(c, dp_group)),
                         lv(p.dp));
    });
    rec.add("time.optimizer", p.optimizer, "s", [&] {
      return fmt::format("{:.4g} params × {} B (2×{} state read+written, 2×{} gradient read for update and norm, "
                         "{}×{} weights) / {} {:.4g} GB/s{}{}",
                         opt_params, bytes_per_param, sb.optim, sb.grad, own_master ? 2 : 1, sb.weight,
                         l.offload == "optimizer" ? "host bandwidth" : "memory bandwidth",
                         (l.offload == "optimizer" ? kHostMemBw : d.mem_bw) / 1e9,
                         rate_bound ? fmt::format("; bound by the measured update rate {:.4g} params/s",
                                                  d.optimizer_params_per_s) : std::string(),
                         l.optimizer == "muon"
                             ? fmt::format(" + DMuon: Newton–Schulz 5·(4r²c + 2r³) FLOPs per hidden r×c matrix (r ≤ c), "
                                           "{:.4g} FLOPs over the {} matrices of the stage, owners balanced "
                                           "longest-first: max(total/N, largest) = max({} / {}, {}) = {} + exchange "
                                           "{} ({:.4g} MB fp32: {})",
                                           muon.flops, muon.matrices, fmt_s(muon.ns_total), muon.owners,
                                           fmt_s(muon.ns_largest), fmt_s(muon.ns), fmt_s(muon.exchange),
                                           muon.exchange_bytes / 1e6,
                                           l.zero >= 1 ? "each rank's pieces, sent to the owners and back by 2 all-to-alls"
                                                       : "the buffer of 1 all-gather of the owners' updates")
                             : std::string());
    });
    rec.add("time.offload", p.offload, "s", [&] { return "optimizer offload: gradients to host + weights back over the host link"; });
    rec.add("time.outer_sync", p.outer.total(), "s", [&] {
      return fmt::format("DiLoCo/gossip sync of fp32 pseudo-gradients × compression {:g}, every H={} steps: {}",
                         l.diloco_compression, std::max<int64_t>(1, l.diloco_h), lv(p.outer));
    });
    rec.add("time.sync_wait", p.sync_wait, "s", [&] {
      if (d.intra_wall_bw <= 0) return std::string("none: the links are not CPU-timed calibrations");
      return fmt::format("a rank asleep in blocking collectives: the step with every intra-node collective at the "
                         "calibration's wall-clock fit ({:.4g} GB/s + {:.4g} us per step) less the step at its "
                         "CPU-time fit ({:.4g} GB/s + {:.4g} us){}", d.intra_wall_bw / 1e9, 1e6 * d.intra_wall_latency,
                         d.intra_bw / 1e9, 1e6 * d.intra_latency,
                         p.sync_wait > 0 ? "" : " (no intra-node collective, or the link overridden)") +
             (p.gap_wait > 0 ? fmt::format("; of it {:.4g} s the compute between collectives adds: {:g} blocking tp/cp/ep "
                                           "collectives × ({:.4g} us + {:.4g} × {:.4g} ms of compute before each), "
                                           "`atoll bench comm --gap-us`", p.gap_wait, p.gap_wait_points,
                                           1e6 * d.gap_wait_intercept, d.gap_wait_slope, 1e3 * p.gap_wait_compute)
                             : std::string());
    });
    rec.add("time.step", p.step, "s", [&] {
      return "(m + (p−1)/v) × micro-batch time (FSDP copies included) + parameter-gradient zeroing + p2p + dp + "
             "optimizer + offload + outer sync + the step's own collectives + the wait in them (sync_wait)";
    });
    rec.add("throughput.tokens_per_s", p.tokens_per_s, "tokens/s", [&] {
      return fmt::format("global batch {} × seq {} / step {}", l.batch(), m.seq, fmt_s(p.step));
    });
    rec.add("throughput.tokens_per_s_device", p.tokens_per_s_device, "tokens/s",
            [&] { return fmt::format("tokens/s / {} devices", c.world()); });
    rec.add("throughput.tokens_per_s_island", p.tokens_per_s_island, "tokens/s",
            [&] { return fmt::format("tokens/s / {} islands", c.islands); });
    rec.add("utilization.mfu", p.mfu, "", [&] {
      return fmt::format("{:.4g} model FLOPs/token (no recompute) × tokens/s/device / peak {:.4g} TFLOP/s",
                         p.model_flops_per_token, peak / 1e12);
    });
    rec.add("utilization.hfu", p.hfu, "", [&] { return fmt::format("as MFU with recompute FLOPs ({:.4g}/token)", p.hardware_flops_per_token); });
    rec.add("train.fault_overhead", p.fault_overhead, "", [&] {
      if (!opt.fault.active()) return std::string("no fault model ([run] checkpoint_s and mtbf_hours / device_mtbf_hours)");
      return fmt::format("δ/τ + (τ/2 + R)/M = {:.4g}/{:.4g} + ({:.4g}/2 + {:.4g})/{:.4g} (checkpoint δ s, interval τ = {} "
                         "s, restart R s, job MTBF M s; Young 1974 / Daly 2006)",
                         opt.fault.checkpoint_s, p.checkpoint_interval, p.checkpoint_interval, opt.fault.restart_s,
                         job_mtbf(opt.fault, c.world()),
                         opt.fault.interval_s > 0 ? "given" : "the optimum √(2·δ·M)");
    });
    rec.add("train.seconds", p.train_seconds, "s", [&] {
      return fmt::format("{:.4g} tokens / tokens/s{}", opt.train_tokens,
                         opt.fault.active() ? fmt::format(" / (1 − fault overhead {:.4g})", p.fault_overhead) : "");
    });
    rec.add("train.cost", p.train_cost, "USD", [&] {
      return fmt::format("hours × cluster price {:.4g} USD/h ({} devices)", p.price_per_hour, c.world());
    });
    p.figures = rec.figures();
  }
  return p;
}

}  // namespace atl::plan
