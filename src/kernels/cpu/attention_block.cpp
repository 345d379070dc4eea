// Attention of one block of queries over one block of keys and values of the same row, the unit
// of ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers for
// Near-Infinite Context"; the blockwise online softmax of Milakov & Gimelshein 2018 and
// FlashAttention, Dao et al. 2022). The queries and the key/value block live in separate buffers
// (a rank's own qkv and a block received from a neighbour), each with its own length; the mask is
// a per-position visible range, so causal, full and document masks over global positions are all
// one kernel (kernels/dispatch.h). Forward returns the pair's normalised output and its lse, which
// the caller merges over blocks; backward takes the merged lse and D = dO·O, so that every pair's
// probabilities are the final ones, and accumulates dQ and the block's dK/dV.
//
// Row-wise and exact like attention_ranged.cpp (the same dot products and exp_approx), with its
// two race-free backward passes: dQ per query row, dK and dV per key row over its head group.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"

namespace atl::cpu {

using detail::axpy_row;
using detail::dotp;

void attention_block_forward(float* out, float* lse, const float* q, int64_t q_stride, const float* kv,
                             const kernels::AttentionRanges& rg, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                             int64_t KV, int64_t hd) {
  ATOLL_CHECK(KV > 0 && H % KV == 0, "attention: {} query heads are not a multiple of {} kv heads", H, KV);
  const int64_t KS = 2 * KV * hd, OS = H * hd, rep = H / KV;
  const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel if(parallel : B * H * Tq * Tk * hd >= detail::kMinParallelWork)
  {
    float* s = detail::scratch<float, 6>(size_t(std::max<int64_t>(Tk, 1)));
#pragma omp for schedule(dynamic, 16)
    for (int64_t task = 0; task < B * H * Tq; ++task) {
      const int64_t t = task % Tq, h = (task / Tq) % H, b = task / (Tq * H), g = h / rep;
      const int64_t lo = rg.k_lo[b * Tq + t], hi = rg.k_hi[b * Tq + t];
      const float* qr = q + (b * Tq + t) * q_stride + h * hd;
      const float* kb = kv + b * Tk * KS;
      float* o = out + (b * Tq + t) * OS + h * hd;
      std::fill(o, o + hd, 0.0f);
      if (hi <= lo) {
        lse[(b * H + h) * Tq + t] = -INFINITY;
        continue;
      }
      float m = -INFINITY;
      for (int64_t j = lo; j < hi; ++j) {
        s[j - lo] = dotp(qr, kb + j * KS + g * hd, hd) * scale;
        m = std::max(m, s[j - lo]);
      }
      float l = 0.0f;
#pragma omp simd reduction(+ : l)
      for (int64_t j = 0; j < hi - lo; ++j) {
        s[j] = detail::exp_approx(s[j] - m);
        l += s[j];
      }
      for (int64_t j = lo; j < hi; ++j) axpy_row(o, s[j - lo], kb + j * KS + (KV + g) * hd, hd);
      const float inv = 1.0f / l;
      for (int64_t e = 0; e < hd; ++e) o[e] *= inv;
      lse[(b * H + h) * Tq + t] = m + std::log(l);
    }
  }
}

void attention_block_backward(float* dq, float* dkv, const float* dout, const float* D, const float* lse,
                              const float* q, int64_t q_stride, const float* kv, const kernels::AttentionRanges& rg,
                              int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t hd) {
  ATOLL_CHECK(KV > 0 && H % KV == 0, "attention: {} query heads are not a multiple of {} kv heads", H, KV);
  const int64_t KS = 2 * KV * hd, OS = H * hd, rep = H / KV;
  const float scale = 1.0f / std::sqrt(float(hd));
  const bool par = B * H * Tq * Tk * hd >= detail::kMinParallelWork;
  // dQ_t += scale Σ_j P_tj (dO_t·v_j - D_t) k_j over the block's visible keys.
  if (dq) {
#pragma omp parallel for schedule(dynamic, 16) if(parallel : par)
    for (int64_t task = 0; task < B * H * Tq; ++task) {
      const int64_t t = task % Tq, h = (task / Tq) % H, b = task / (Tq * H), g = h / rep;
      const int64_t lo = rg.k_lo[b * Tq + t], hi = rg.k_hi[b * Tq + t];
      const float* qr = q + (b * Tq + t) * q_stride + h * hd;
      const float* kb = kv + b * Tk * KS;
      const float* dO = dout + (b * Tq + t) * OS + h * hd;
      const float L = lse[(b * H + h) * Tq + t], Dt = D[(b * H + h) * Tq + t];
      float* dqr = dq + (b * Tq + t) * q_stride + h * hd;
      for (int64_t j = lo; j < hi; ++j) {
        const float* k = kb + j * KS + g * hd;
        const float p = detail::exp_approx(dotp(qr, k, hd) * scale - L);
        axpy_row(dqr, p * (dotp(dO, k + KV * hd, hd) - Dt) * scale, k, hd);
      }
    }
  }
  // dV_j += Σ_h Σ_t P_tj dO_t and dK_j += Σ_h Σ_t dS_tj q_t over this block's queries that see key j.
#pragma omp parallel for schedule(dynamic, 16) if(parallel : par)
  for (int64_t task = 0; task < B * KV * Tk; ++task) {
    const int64_t j = task % Tk, g = (task / Tk) % KV, b = task / (Tk * KV);
    const int64_t lo = rg.q_lo[b * Tk + j], hi = rg.q_hi[b * Tk + j];
    const float* k = kv + (b * Tk + j) * KS + g * hd;
    const float* v = k + KV * hd;
    float* dk = dkv + (b * Tk + j) * KS + g * hd;
    float* dv = dk + KV * hd;
    for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
      for (int64_t t = lo; t < hi; ++t) {
        const float* qr = q + (b * Tq + t) * q_stride + h * hd;
        const float* dO = dout + (b * Tq + t) * OS + h * hd;
        const float p = detail::exp_approx(dotp(qr, k, hd) * scale - lse[(b * H + h) * Tq + t]);
        axpy_row(dv, p, dO, hd);
        axpy_row(dk, p * (dotp(dO, v, hd) - D[(b * H + h) * Tq + t]) * scale, qr, hd);
      }
    }
  }
}

}  // namespace atl::cpu
