// Self-attention with a per-position visible key range, for attention that is not causal (an
// encoder, a diffusion transformer) or that is masked at document boundaries when variable-length
// sequences are packed into one row (each token sees only its own document: the block-diagonal
// mask of packed training, as in FlashAttention's varlen interface, Dao 2023). Query t sees keys
// [k_lo[t], k_hi[t]) and key j is seen by queries [q_lo[j], q_hi[j]) (kernels/dispatch.h), which
// covers causal, full and document masks alike. Grouped-query heads as in attention_forward.cpp;
// the lse it saves has the same [B,H,T] layout.
//
// This is the row-wise formulation (a score row per query, exact softmax, probabilities recomputed
// in backward from the lse): simple and exact, not blocked like the causal kernel, so it is for
// these masks, not for the GPT hot path. Backward runs two race-free passes as the causal kernel
// does: dQ per query row, then dK and dV per key row summing the heads of its group.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"

namespace atl::cpu {

using detail::axpy_row;
using detail::dotp;

void attention_ranged_forward(float* out, float* lse, const float* qkv, const kernels::AttentionRanges& rg, int64_t B,
                              int64_t T, int64_t H, int64_t KV, int64_t hd) {
  ATOLL_CHECK(KV > 0 && H % KV == 0, "attention: {} query heads are not a multiple of {} kv heads", H, KV);
  const int64_t S = (H + 2 * KV) * hd, OS = H * hd, rep = H / KV;
  const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel if(parallel : B * H * T * T * hd >= detail::kMinParallelWork)
  {
    float* s = detail::scratch<float, 4>(size_t(T));
#pragma omp for schedule(dynamic, 16)
    for (int64_t task = 0; task < B * H * T; ++task) {
      const int64_t t = task % T, h = (task / T) % H, b = task / (T * H), g = h / rep;
      const int64_t lo = rg.k_lo[b * T + t], hi = rg.k_hi[b * T + t];
      const float* base = qkv + b * T * S;
      const float* q = base + t * S + h * hd;
      float m = -INFINITY;
      for (int64_t j = lo; j < hi; ++j) {
        s[j - lo] = dotp(q, base + j * S + (H + g) * hd, hd) * scale;
        m = std::max(m, s[j - lo]);
      }
      float l = 0.0f;
#pragma omp simd reduction(+ : l)
      for (int64_t j = 0; j < hi - lo; ++j) {
        s[j] = detail::exp_approx(s[j] - m);
        l += s[j];
      }
      float* o = out + (b * T + t) * OS + h * hd;
      std::fill(o, o + hd, 0.0f);
      for (int64_t j = lo; j < hi; ++j) axpy_row(o, s[j - lo], base + j * S + (H + KV + g) * hd, hd);
      const float inv = 1.0f / l;
      for (int64_t e = 0; e < hd; ++e) o[e] *= inv;
      lse[(b * H + h) * T + t] = m + std::log(l);
    }
  }
}

void attention_ranged_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                               const kernels::AttentionRanges& rg, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t hd) {
  ATOLL_CHECK(KV > 0 && H % KV == 0, "attention: {} query heads are not a multiple of {} kv heads", H, KV);
  const int64_t S = (H + 2 * KV) * hd, OS = H * hd, rep = H / KV;
  const float scale = 1.0f / std::sqrt(float(hd));
  const bool par = B * H * T * T * hd >= detail::kMinParallelWork;
  float* D = detail::scratch<float, 5>(size_t(B * H * T));  // D = dO·O per (b, h, t)
#pragma omp parallel for schedule(static) if(parallel : par)
  for (int64_t task = 0; task < B * H * T; ++task) {
    const int64_t t = task % T, h = (task / T) % H, b = task / (T * H);
    const int64_t row = (b * T + t) * OS + h * hd;
    D[(b * H + h) * T + t] = dotp(dout + row, out + row, hd);
  }
  // dQ_t = scale Σ_j P_tj (dO_t·v_j - D_t) k_j
#pragma omp parallel for schedule(dynamic, 16) if(parallel : par)
  for (int64_t task = 0; task < B * H * T; ++task) {
    const int64_t t = task % T, h = (task / T) % H, b = task / (T * H), g = h / rep;
    const int64_t lo = rg.k_lo[b * T + t], hi = rg.k_hi[b * T + t];
    const float* base = qkv + b * T * S;
    const float* q = base + t * S + h * hd;
    const float* dO = dout + (b * T + t) * OS + h * hd;
    const float L = lse[(b * H + h) * T + t], Dt = D[(b * H + h) * T + t];
    float* dq = dqkv + (b * T + t) * S + h * hd;
    for (int64_t j = lo; j < hi; ++j) {
      const float* k = base + j * S + (H + g) * hd;
      const float p = detail::exp_approx(dotp(q, k, hd) * scale - L);
      const float ds = p * (dotp(dO, k + KV * hd, hd) - Dt) * scale;
      axpy_row(dq, ds, k, hd);
    }
  }
  // dV_j = Σ_h Σ_t P_tj dO_t and dK_j = Σ_h Σ_t dS_tj q_t over the queries that see key j.
#pragma omp parallel for schedule(dynamic, 16) if(parallel : par)
  for (int64_t task = 0; task < B * KV * T; ++task) {
    const int64_t j = task % T, g = (task / T) % KV, b = task / (T * KV);
    const int64_t lo = rg.q_lo[b * T + j], hi = rg.q_hi[b * T + j];
    const float* base = qkv + b * T * S;
    const float* k = base + j * S + (H + g) * hd;
    const float* v = k + KV * hd;
    float* dk = dqkv + (b * T + j) * S + (H + g) * hd;
    float* dv = dk + KV * hd;
    for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
      for (int64_t t = lo; t < hi; ++t) {
        const float* q = base + t * S + h * hd;
        const float* dO = dout + (b * T + t) * OS + h * hd;
        const float p = detail::exp_approx(dotp(q, k, hd) * scale - lse[(b * H + h) * T + t]);
        axpy_row(dv, p, dO, hd);
        axpy_row(dk, p * (dotp(dO, v, hd) - D[(b * H + h) * T + t]) * scale, q, hd);
      }
    }
  }
}

}  // namespace atl::cpu
