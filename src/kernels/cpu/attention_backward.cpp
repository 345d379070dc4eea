// Causal self-attention backward in the style of FlashAttention-2 (Dao 2023): probabilities are
// recomputed block by block from the saved log-sum-exp, P = exp(scale·QKᵀ - lse), and with
// D_i = dO_i·O_i the score gradient is dS = P ∘ (dO·Vᵀ - D). FlashAttention-2 accumulates dQ with
// atomics across key-block tasks; on a CPU that would serialise, so this file runs two race-free
// passes instead: one parallel over query blocks for dQ, one parallel over (kv head, key block)
// for dK and dV, which also sums the GQA query heads that share a kv head without contention.
// Both passes work on transposed score tiles (rows = keys, as in attention_forward.cpp) against
// Qᵀ and dOᵀ blocks that are packed once up front, so K, V, Q and dO are otherwise read in place.
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

namespace {

using namespace detail;
constexpr int64_t BL = kAttnBlock;

struct Dims {
  int64_t B, T, H, KV, hd, hdp, S, OS, rep, nblk;
  float scale;
  // Packed per (b, h, query block): Qᵀ and dOᵀ [hd][64]; D [B,H,T].
  float* Qt;
  float* dOt;
  float* D;
  const float* qt(int64_t b, int64_t h, int64_t qb) const { return Qt + ((b * H + h) * nblk + qb) * hd * BL; }
  const float* dot(int64_t b, int64_t h, int64_t qb) const { return dOt + ((b * H + h) * nblk + qb) * hd * BL; }
};

void prepack(const float* dout, const float* qkv, const float* out, Dims& d) {
#pragma omp parallel for schedule(static) if(parallel : d.B * d.H * d.T * d.hd >= detail::kMinParallelWork)
  for (int64_t task = 0; task < d.B * d.H * d.nblk; ++task) {
    const int64_t qb = task % d.nblk, h = (task / d.nblk) % d.H, b = task / (d.nblk * d.H);
    const int64_t i0 = qb * BL, nq = std::min(BL, d.T - i0);
    const float* qrows[BL];
    const float* orows[BL];
    for (int64_t r = 0; r < nq; ++r) {
      qrows[r] = qkv + (b * d.T + i0 + r) * d.S + h * d.hd;
      orows[r] = dout + (b * d.T + i0 + r) * d.OS + h * d.hd;
      const float* y = out + (b * d.T + i0 + r) * d.OS + h * d.hd;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t e = 0; e < d.hd; ++e) s += orows[r][e] * y[e];
      d.D[(b * d.H + h) * d.T + i0 + r] = s;
    }
    pack_transposed(const_cast<float*>(d.qt(b, h, qb)), qrows, nq, d.hd);
    pack_transposed(const_cast<float*>(d.dot(b, h, qb)), orows, nq, d.hd);
  }
}

// dSᵀ for one (key block, query block) pair, in place over Sᵀ: P = exp(scale·S - lse) for the
// causally visible entries, dS = P (dP - D) · scale (the score scale folded in), 0 elsewhere.
// When Pout is given it also receives P (for dV).
inline void score_grads(float* St, const float* dPt, float* Pout, const float* L, const float* D, int64_t j0,
                        int64_t i0, int64_t nk, int64_t nq, float scale) {
  for (int64_t j = 0; j < nk; ++j) {
    float* s = St + j * BL;
    const float* dp = dPt + j * BL;
    float* po = Pout ? Pout + j * BL : nullptr;
    const int64_t rmin = std::min(nq, std::max<int64_t>(0, j0 + j - i0));
    for (int64_t r = 0; r < rmin; ++r) s[r] = 0.0f;
    if (po) {
      for (int64_t r = 0; r < rmin; ++r) po[r] = 0.0f;
#pragma omp simd
      for (int64_t r = rmin; r < nq; ++r) {
        const float p = exp_approx(s[r] * scale - L[r]);
        po[r] = p;
        s[r] = p * (dp[r] - D[r]) * scale;
      }
      for (int64_t r = nq; r < BL; ++r) po[r] = 0.0f;
    } else {
#pragma omp simd
      for (int64_t r = rmin; r < nq; ++r) {
        const float p = exp_approx(s[r] * scale - L[r]);
        s[r] = p * (dp[r] - D[r]) * scale;
      }
    }
    for (int64_t r = nq; r < BL; ++r) s[r] = 0.0f;
  }
}

// dQ for every (batch, head, query block): dQ = dS·K.
void backward_dq(float* dqkv, const float* qkv, const float* lse, const Dims& d) {
#pragma omp parallel if(parallel : d.B * d.H * d.T * d.T * d.hd / 2 >= detail::kMinParallelWork)
  {
    float* St = scratch<float, 1>(size_t(2 * BL * BL + 2 * BL * d.hdp));
    float* dPt = St + BL * BL;
    float* dQ = dPt + BL * BL;
    float* Kpad = dQ + BL * d.hdp;
    const float* rows[BL];

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < d.B * d.H * d.nblk; ++task) {
      const int64_t qb = d.nblk - 1 - task % d.nblk;
      const int64_t h = (task / d.nblk) % d.H;
      const int64_t b = task / (d.nblk * d.H);
      const int64_t g = h / d.rep;
      const int64_t i0 = qb * BL, nq = std::min(BL, d.T - i0);
      const int64_t qrows = round_up(nq, kTileRows);
      const float* base = qkv + b * d.T * d.S;
      const float* L = lse + (b * d.H + h) * d.T + i0;
      const float* D = d.D + (b * d.H + h) * d.T + i0;
      std::fill(dQ, dQ + qrows * d.hdp, 0.0f);

      const int64_t kend = i0 + nq;
      for (int64_t j0 = 0; j0 < kend; j0 += BL) {
        const int64_t nk = std::min(BL, kend - j0), krows = round_up(nk, kTileRows);
        for (int64_t j = 0; j < krows; ++j) rows[j] = base + (j0 + std::min(j, nk - 1)) * d.S + (d.H + g) * d.hd;
        block_abt(St, rows, d.qt(b, h, qb), d.hd, krows);  // Sᵀ = K·Qᵀ
        for (int64_t j = 0; j < krows; ++j) rows[j] += d.KV * d.hd;  // the v head sits KV heads on
        block_abt(dPt, rows, d.dot(b, h, qb), d.hd, krows);  // dPᵀ = V·dOᵀ
        score_grads(St, dPt, nullptr, L, D, j0, i0, nk, nq, d.scale);
        int64_t ldk;
        const float* K = rows_operand(base + j0 * d.S + (d.H + g) * d.hd, d.S, nk, d.hd, d.hdp, Kpad, &ldk);
        block_pm(dQ, d.hdp, St, 1, BL, K, ldk, qrows, d.hdp, nk);  // dQ += dS·K
      }
      for (int64_t r = 0; r < nq; ++r) {
        float* dst = dqkv + (b * d.T + i0 + r) * d.S + h * d.hd;
        const float* src = dQ + r * d.hdp;
#pragma omp simd
        for (int64_t e = 0; e < d.hd; ++e) dst[e] += src[e];
      }
    }
  }
}

// dK = dSᵀ·Q and dV = Pᵀ·dO for every (batch, kv head, key block), summing the group's heads.
void backward_dkv(float* dqkv, const float* dout, const float* qkv, const float* lse, const Dims& d) {
#pragma omp parallel if(parallel : d.B * d.H * d.T * d.T * d.hd / 2 >= detail::kMinParallelWork)
  {
    float* St = scratch<float, 2>(size_t(3 * BL * BL + 3 * BL * d.hdp));
    float* dPt = St + BL * BL;
    float* Pt = dPt + BL * BL;
    float* dK = Pt + BL * BL;
    float* dV = dK + BL * d.hdp;
    float* pad = dV + BL * d.hdp;
    const float* krows[BL];
    const float* vrows[BL];

    // Key block 0 sees every query block: heaviest first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < d.B * d.KV * d.nblk; ++task) {
      const int64_t kb = task % d.nblk;
      const int64_t g = (task / d.nblk) % d.KV;
      const int64_t b = task / (d.nblk * d.KV);
      const int64_t j0 = kb * BL, nk = std::min(BL, d.T - j0);
      const int64_t krows_n = round_up(nk, kTileRows);
      const float* base = qkv + b * d.T * d.S;
      for (int64_t j = 0; j < krows_n; ++j) {
        krows[j] = base + (j0 + std::min(j, nk - 1)) * d.S + (d.H + g) * d.hd;
        vrows[j] = krows[j] + d.KV * d.hd;
      }
      std::fill(dK, dK + krows_n * d.hdp, 0.0f);
      std::fill(dV, dV + krows_n * d.hdp, 0.0f);

      for (int64_t h = g * d.rep; h < (g + 1) * d.rep; ++h) {
        for (int64_t qb = kb; qb < d.nblk; ++qb) {  // causal: queries from the key block on
          const int64_t i0 = qb * BL, nq = std::min(BL, d.T - i0);
          block_abt(St, krows, d.qt(b, h, qb), d.hd, krows_n);    // Sᵀ = K·Qᵀ
          block_abt(dPt, vrows, d.dot(b, h, qb), d.hd, krows_n);  // dPᵀ = V·dOᵀ
          score_grads(St, dPt, Pt, lse + (b * d.H + h) * d.T + i0, d.D + (b * d.H + h) * d.T + i0, j0, i0, nk, nq,
                      d.scale);
          int64_t ld;
          const float* dO = rows_operand(dout + (b * d.T + i0) * d.OS + h * d.hd, d.OS, nq, d.hd, d.hdp, pad, &ld);
          block_pm(dV, d.hdp, Pt, BL, 1, dO, ld, krows_n, d.hdp, nq);  // dV += Pᵀ·dO
          const float* Q = rows_operand(base + i0 * d.S + h * d.hd, d.S, nq, d.hd, d.hdp, pad, &ld);
          block_pm(dK, d.hdp, St, BL, 1, Q, ld, krows_n, d.hdp, nq);  // dK += dSᵀ·Q
        }
      }
      for (int64_t j = 0; j < nk; ++j) {
        float* dk = dqkv + (b * d.T + j0 + j) * d.S + (d.H + g) * d.hd;
        float* dv = dk + d.KV * d.hd;
        const float* sk = dK + j * d.hdp;
        const float* sv = dV + j * d.hdp;
#pragma omp simd
        for (int64_t e = 0; e < d.hd; ++e) {
          dk[e] += sk[e];
          dv[e] += sv[e];
        }
      }
    }
  }
}

}  // namespace

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  ATOLL_CHECK(KV > 0 && H % KV == 0, "attention: {} query heads are not a multiple of {} kv heads", H, KV);
  Dims d{B, T, H, KV, hd, round_up(hd, 16), (H + 2 * KV) * hd, H * hd, H / KV, (T + BL - 1) / BL,
         1.0f / std::sqrt(float(hd)), nullptr, nullptr, nullptr};
  const int64_t packed = B * H * d.nblk * hd * BL;
  d.Qt = scratch<float, 3>(size_t(2 * packed + B * H * T));  // the calling thread's, grown once
  d.dOt = d.Qt + packed;
  d.D = d.dOt + packed;
  prepack(dout, qkv, out, d);
  backward_dq(dqkv, qkv, lse, d);
  backward_dkv(dqkv, dout, qkv, lse, d);
}

}  // namespace atl::cpu
