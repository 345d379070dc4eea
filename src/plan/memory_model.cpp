// Memory per device. Model states follow Rajbhandari et al. 2020 (ZeRO): baseline (2+2+K)Ψ,
// P_os 2Ψ+2Ψ+KΨ/Nd, P_os+g 2Ψ+(2+K)Ψ/Nd, P_os+g+p (2+2+K)Ψ/Nd. Activations follow Korthikanti et
// al. 2022 Table 2, e.g. sbh(34 + 5as/h) bytes per layer without parallelism; here each of its
// terms is kept separately so GQA, SwiGLU, MoE, flash attention and no-dropout models use the
// same accounting. Pipeline in-flight micro-batches follow Narayanan et al. 2021 §2.2 and
// Korthikanti et al. §4.2.3 (interleaving multiplies by 1 + (p-1)/(p·v)).
#include "plan/memory_model.h"

#include <algorithm>
#include <fmt/format.h>

namespace atl::plan {

double layer_activation_bytes(const ModelSpec& m, int64_t b, int64_t s, const ActivationOptions& o) {
  const double h = double(m.hidden), t = double(o.t), sb = double(s) * b;
  const double e = o.act_bytes;  // a "2" in Korthikanti's terms is one 16-bit element
  const double mask = m.dropout ? 1.0 : 0.0;
  // Replicated across tp ranks unless sequence parallelism splits them (the "10" in Table 2):
  // two layernorm inputs, the inputs of the QKV and first MLP matmuls, two dropout masks.
  double repl = e * (h + h + h + h) + mask * 2 * h;
  // Split over tp (the "24" in Table 2): Q, K, V, the output-projection input, the MLP.
  double qkv = e * (m.q_dim() + 2.0 * m.kv_dim()) + e * m.value_dim();
  double ffn_per_token;
  if (o.moe_layer) {
    double f = double(m.expert_ffn) * (m.top_k + m.shared_experts);
    ffn_per_token = e * (m.ffn_type == "swiglu" ? 3 * f : 2 * f) + 4.0 * m.experts;  // + router logits
  } else {
    double f = double(m.ffn);
    ffn_per_token = e * (m.ffn_type == "swiglu" ? 3 * f : 2 * f);
  }
  double split = qkv + ffn_per_token;
  // The attention core (the "5as/h"): softmax output, its dropout mask and dropout output.
  double core;
  if (m.attention == "standard")
    core = double(m.heads) * s * (e + mask * (1 + e));
  else
    core = 4.0 * m.heads;  // flash attention keeps one fp32 log-sum-exp per head and row
  if (o.recompute == "full") {
    // Only the layer input survives (2sbh, split by tp under sp); the working set of the layer
    // being recomputed is counted once by the caller.
    return sb * e * h / (o.sp ? t : 1.0);
  }
  if (o.recompute == "selective") core = 0;
  return sb * (repl / (o.sp ? t : 1.0) + (split + core) / t);
}

StateBytes state_bytes(const std::string& precision, const std::string& optimizer) {
  bool mixed = precision != "fp32" && precision != "tf32";
  StateBytes s;
  s.weight = mixed ? 2 : 4;
  s.grad = mixed ? 2 : 4;
  // Adam: fp32 master copy (mixed only), first and second moments. Muon: master + momentum.
  if (optimizer == "muon") s.optim = mixed ? 8 : 4;
  else s.optim = mixed ? 12 : 8;
  return s;
}

double zero_model_state_bytes(double psi, int stage, int64_t nd, const StateBytes& sb) {
  double n = double(std::max<int64_t>(1, nd));
  double w = sb.weight * psi, g = sb.grad * psi, o = sb.optim * psi;
  if (stage >= 1) o /= n;
  if (stage >= 2) g /= n;
  if (stage >= 3) w /= n;
  return w + g + o;
}

// With uneven stages the heaviest one sets the pace: ⌈L/p⌉ layers, or with the interleaved
// schedule v chunks of ⌈L/(p·v)⌉ (at most L/p rounded up to whole chunks).
int64_t layers_per_stage(const ModelSpec& m, const Layout& l) {
  if (l.schedule == "interleaved" && l.virtual_stages > 1) {
    const int64_t chunks = l.pp * l.virtual_stages;
    return std::min<int64_t>(m.layers, l.virtual_stages * ((m.layers + chunks - 1) / chunks));
  }
  return (m.layers + l.pp - 1) / l.pp;
}

namespace {
struct StageParams {
  double dense = 0, expert = 0;  // per device, before ZeRO
  int64_t moe_layers = 0, layers = 0;
};
StageParams stage_params(const ModelSpec& m, const Layout& l, int64_t stage) {
  StageParams p;
  int64_t per = layers_per_stage(m, l);
  int64_t first = stage * per, last = std::min<int64_t>(m.layers, first + per);
  double t = double(l.tp);
  double expert_split = double(l.ep) * (l.ep > 1 ? 1.0 : t);
  for (int64_t i = first; i < last; ++i) {
    ++p.layers;
    if (m.layer_is_moe(i)) {
      ++p.moe_layers;
      p.dense += (m.attn_params() + 2 * m.norm_params() + m.shared_experts * m.expert_params() +
                  m.experts * m.hidden) / t;
      p.expert += double(m.experts) * m.expert_params() / expert_split;
    } else {
      p.dense += double(m.layer_params(i)) / t;
    }
  }
  if (stage == 0) p.dense += double(m.embedding_params()) / t;
  if (stage == l.pp - 1) {
    p.dense += double(m.norm_params());
    if (!m.tied_head) p.dense += double(m.head_params()) / t;
    else if (l.pp > 1) p.dense += double(m.vocab) * m.hidden / t;  // the last stage's copy of the tied matrix
  }
  return p;
}
}  // namespace

MemoryBreakdown predict_memory(const ModelSpec& m, const Layout& l, const Cluster& c, Recorder& rec) {
  StateBytes sb = state_bytes(l.precision, l.optimizer);
  const double act_e = (l.precision == "fp32" || l.precision == "tf32") ? 4.0 : 2.0;
  const int64_t nd_dense = l.hsdp ? l.hsdp : l.dp_inner(c.islands) * l.cp;
  const int64_t nd_expert = std::max<int64_t>(1, nd_dense / l.ep);
  const int64_t m_micro = l.micro_batches();
  const int64_t s_local = m.seq / l.cp;

  double inflight;
  if (l.pp == 1) inflight = 1;
  else if (l.schedule == "gpipe") inflight = double(m_micro);
  else if (l.schedule == "interleaved")
    inflight = std::min<double>(m_micro, l.pp * (1.0 + double(l.pp - 1) / (l.pp * l.virtual_stages)));
  else inflight = double(std::min<int64_t>(l.pp, m_micro));

  MemoryBreakdown best;
  const std::vector<int64_t> stages = l.pp > 1 ? std::vector<int64_t>{0, l.pp - 1} : std::vector<int64_t>{0};
  for (int64_t st : stages) {
    StageParams p = stage_params(m, l, st);
    MemoryBreakdown mb;
    auto shard = [&](double psi_dense, double psi_expert, double per_param, int min_stage) {
      return psi_dense * per_param / (l.zero >= min_stage ? double(nd_dense) : 1.0) +
             psi_expert * per_param / (l.zero >= min_stage ? double(nd_expert) : 1.0);
    };
    mb.params_per_device = p.dense + p.expert;
    mb.params = shard(p.dense, p.expert, sb.weight, 3);
    mb.grads = shard(p.dense, p.expert, sb.grad, 2);
    mb.optimizer = l.offload == "optimizer" ? 0.0 : shard(p.dense, p.expert, sb.optim, 1);
    ActivationOptions ao{l.tp, l.sp, l.recompute, act_e, false};
    ActivationOptions ao_moe = ao;
    ao_moe.moe_layer = true;
    double per_dense = layer_activation_bytes(m, l.micro_batch, s_local, ao);
    double per_moe = layer_activation_bytes(m, l.micro_batch, s_local, ao_moe);
    double stored = (p.layers - p.moe_layers) * per_dense + p.moe_layers * per_moe;
    mb.activations = stored * inflight;
    if (l.recompute == "full") {
      ActivationOptions ws = ao;
      ws.recompute = "none";
      ws.moe_layer = p.moe_layers > 0;
      mb.activations += layer_activation_bytes(m, l.micro_batch, s_local, ws);
    }
    // Buffers: runtime reserve, fp32 logits and their gradient on the last stage, ZeRO-3's
    // gathered layer (with one prefetched), and a data-parallel gradient bucket.
    double logits = st == l.pp - 1 ? 2.0 * 4.0 * l.micro_batch * s_local * double(m.vocab) / l.tp : 0;
    double z3 = l.zero >= 3 && p.layers > 0 ? 2.0 * sb.weight * (p.dense + p.expert) / p.layers : 0;
    double bucket = l.dp > 1 ? std::min(mb.grads, 1e8) : 0;
    mb.buffers = c.device.reserved_bytes + logits + z3 + bucket;
    mb.total = mb.params + mb.grads + mb.optimizer + mb.activations + mb.buffers;
    if (mb.total > best.total) best = mb;
  }
  best.capacity = c.device.mem_bytes;
  best.margin = best.capacity - best.total;
  best.oom = best.margin < 0;

  if (rec.explaining()) {
    rec.add("memory.params", best.params, "B", [&] {
      return fmt::format("{:.4g} params on the worst stage × {} B{}", best.params_per_device, sb.weight,
                         l.zero >= 3 ? fmt::format(" / Nd={} (ZeRO-3)", nd_dense) : "");
    });
    rec.add("memory.grads", best.grads, "B", [&] {
      return fmt::format("params × {} B{}", sb.grad, l.zero >= 2 ? fmt::format(" / Nd={} (ZeRO-2+)", nd_dense) : "");
    });
    rec.add("memory.optimizer", best.optimizer, "B", [&] {
      return fmt::format("params × K={} B ({} {}){}{}", sb.optim, l.optimizer, l.precision,
                         l.zero >= 1 ? fmt::format(" / Nd={} (ZeRO-1+)", nd_dense) : "",
                         l.offload == "optimizer" ? " → offloaded to host: 0" : "");
    });
    rec.add("memory.activations", best.activations, "B", [&] {
      return fmt::format("Korthikanti Table 2 per layer (b={}, s={}, h={}, a={}, t={}, sp={}, recompute={}, "
                         "attention={}) × {} layers × {:.3g} in-flight micro-batches ({})",
                         l.micro_batch, s_local, m.hidden, m.heads, l.tp, l.sp, l.recompute, m.attention,
                         layers_per_stage(m, l), inflight, l.pp > 1 ? l.schedule : "no pipeline");
    });
    rec.add("memory.buffers", best.buffers, "B", [&] {
      return fmt::format("reserve {:.3g} GB + fp32 logits/grad 8·b·s·V/t (last stage) + ZeRO-3 gathered layers "
                         "+ gradient bucket", c.device.reserved_bytes / 1e9);
    });
    rec.add("memory.total", best.total, "B", [] { return std::string("params + grads + optimizer + activations + buffers"); });
    rec.add("memory.margin", best.margin, "B", [&] {
      return fmt::format("capacity {:.4g} GB − total{}", best.capacity / 1e9, best.oom ? " → OUT OF MEMORY" : "");
    });
  }
  return best;
}

}  // namespace atl::plan
