#include "rl/policy_loss.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace atl::rl {
namespace {

void check_rows(const Tensor& t, int64_t N, DType d, const char* what) {
  ATOLL_CHECK(t.defined() && t.dtype() == d && t.numel() == N && t.is_contiguous(),
              "rl loss: {} must be a contiguous {} tensor of {} rows", what, d == DType::i32 ? "i32" : "f32", N);
}

// log-sum-exp of one row in double, then back to float: the same arithmetic wherever it runs.
double row_lse(const float* l, int64_t V) {
  const float mx = *std::max_element(l, l + V);
  double z = 0;
  for (int64_t v = 0; v < V; ++v) z += std::exp(double(l[v]) - double(mx));
  return double(mx) + std::log(z);
}

}  // namespace

Tensor token_logprobs(const Tensor& logits, const Tensor& targets) {
  ATOLL_CHECK(logits.dim() >= 1 && logits.dtype() == DType::f32 && logits.is_contiguous(),
              "token_logprobs: logits must be contiguous f32 [N,V]");
  const int64_t V = logits.size(-1), N = logits.numel() / V;
  check_rows(targets, N, DType::i32, "targets");
  Tensor out = Tensor::zeros({N});
  const float* lg = logits.f32();
  const int32_t* tg = targets.i32();
  for (int64_t i = 0; i < N; ++i) {
    if (tg[i] < 0) continue;
    ATOLL_CHECK(tg[i] < V, "token_logprobs: target {} at row {} is outside the vocabulary [0, {})", tg[i], i, V);
    out.f32()[i] = float(double(lg[i * V + tg[i]]) - row_lse(lg + i * V, V));
  }
  return out;
}

Tensor policy_loss(const Tensor& logits, const Tensor& targets, const Tensor& old_logp, const Tensor& ref_logp,
                   const Tensor& adv, const Tensor& weights, const PolicyLossConfig& c, PolicyLossStats* stats) {
  // [..., V] is taken as rows (a view would cut the graph): [B,T,V] logits straight from the head.
  ATOLL_CHECK(logits.dim() >= 2 && logits.dtype() == DType::f32 && logits.is_contiguous(),
              "policy_loss: logits must be contiguous f32 [..., V]");
  const int64_t V = logits.size(-1), N = logits.numel() / V;
  check_rows(targets, N, DType::i32, "targets");
  check_rows(old_logp, N, DType::f32, "old log-probs");
  check_rows(ref_logp, N, DType::f32, "reference log-probs");
  check_rows(adv, N, DType::f32, "advantages");
  check_rows(weights, N, DType::f32, "weights");
  Tensor logp = token_logprobs(logits, targets);
  // dL/dlogp per row, kept for backward.
  Tensor dlogp = Tensor::zeros({N});
  const float *lp = logp.f32(), *old = old_logp.f32(), *ref = ref_logp.f32(), *A = adv.f32(), *w = weights.f32();
  const int32_t* tg = targets.i32();
  double total = 0, kl_sum = 0, clip_n = 0, ratio_sum = 0, ent_sum = 0;
  int64_t n = 0;
  const double lo = 1.0 - double(c.clip_low), hi = 1.0 + double(c.clip_high), beta = c.kl_coef;
  for (int64_t i = 0; i < N; ++i) {
    if (w[i] == 0.0f) continue;
    ATOLL_CHECK(tg[i] >= 0, "policy_loss: row {} has weight {} but no target", i, w[i]);
    const double r = std::exp(double(lp[i]) - double(old[i])), a = A[i];
    const double rc = std::clamp(r, lo, hi);
    const double pg = -std::min(r * a, rc * a);
    // torch.min splits a tie's gradient and clamp passes it inside [lo, hi]: both branches give
    // -A·r there; outside, the unclipped branch carries it only when it is the smaller.
    const bool inside = r >= lo && r <= hi;
    double g = (inside || r * a < rc * a) ? -a * r : 0.0;
    double kl = 0;
    if (beta != 0) {
      const double d = double(ref[i]) - double(lp[i]);
      kl = std::exp(d) - d - 1.0;
      g += beta * (1.0 - std::exp(d));
    }
    total += double(w[i]) * (pg + beta * kl);
    dlogp.f32()[i] = float(double(w[i]) * g);
    if (stats) {
      const float* l = logits.f32() + i * V;
      const double lse = row_lse(l, V);
      double e = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double lq = double(l[v]) - lse;
        e -= std::exp(lq) * lq;
      }
      ent_sum += e;
      kl_sum += beta != 0 ? kl : [&] {
        const double d = double(ref[i]) - double(lp[i]);
        return std::exp(d) - d - 1.0;
      }();
      clip_n += inside ? 0 : 1;
      ratio_sum += r;
    }
    ++n;
  }
  if (stats) {
    const double d = n ? double(n) : 1.0;
    *stats = {kl_sum / d, clip_n / d, ratio_sum / d, ent_sum / d, n};
  }
  Tensor out = Tensor::full({1}, float(total));
  if (should_record({&logits})) {
    record("rl_policy_loss", out, {logits}, [N, V, dlogp, targets](Node& nd) {
      const Tensor& lg = nd.inputs[0];
      if (!requires_grad(lg)) return;
      const float go = grad_of(nd.output).item();
      float* g = grad_buffer(lg).f32();
      const float* l = lg.f32();
      const int32_t* t = targets.i32();
      for (int64_t i = 0; i < N; ++i) {
        const float d = dlogp.f32()[i] * go;
        if (d == 0.0f) continue;
        // d logp / d logit_v = onehot_v - softmax_v
        const double lse = row_lse(l + i * V, V);
        for (int64_t v = 0; v < V; ++v) g[i * V + v] -= float(double(d) * std::exp(double(l[i * V + v]) - lse));
        g[i * V + t[i]] += d;
      }
    });
  }
  return out;
}

Tensor value_loss(const Tensor& values, const Tensor& old_values, const Tensor& returns, const Tensor& weights,
                  float clip) {
  ATOLL_CHECK(values.dtype() == DType::f32 && values.is_contiguous(), "value_loss: values must be contiguous f32");
  const int64_t N = values.numel();
  check_rows(old_values, N, DType::f32, "old values");
  check_rows(returns, N, DType::f32, "returns");
  check_rows(weights, N, DType::f32, "weights");
  const float *v = values.f32(), *ov = old_values.f32(), *R = returns.f32(), *w = weights.f32();
  Tensor dv = Tensor::zeros({N});
  double total = 0;
  for (int64_t i = 0; i < N; ++i) {
    if (w[i] == 0.0f) continue;
    const double e = double(v[i]) - R[i];
    double g = e;
    double l = 0.5 * e * e;
    if (clip > 0) {
      const double delta = double(v[i]) - ov[i];
      const double vc = ov[i] + std::clamp(delta, -double(clip), double(clip));
      const double ec = vc - R[i];
      const bool inside = delta >= -clip && delta <= clip;
      const double lc = 0.5 * ec * ec;
      // max's tie (inside the clip range the two are equal) splits the gradient: e/2 + e/2.
      if (!inside && lc > l) g = 0;
      l = std::max(l, lc);
    }
    total += double(w[i]) * l;
    dv.f32()[i] = float(double(w[i]) * g);
  }
  Tensor out = Tensor::full({1}, float(total));
  if (should_record({&values})) {
    record("rl_value_loss", out, {values}, [N, dv](Node& nd) {
      const Tensor& x = nd.inputs[0];
      if (!requires_grad(x)) return;
      const float go = grad_of(nd.output).item();
      float* g = grad_buffer(x).f32();
      for (int64_t i = 0; i < N; ++i) g[i] += dv.f32()[i] * go;
    });
  }
  return out;
}

}  // namespace atl::rl
