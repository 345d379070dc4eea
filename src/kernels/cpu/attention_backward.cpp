// Causal self-attention backward in the style of FlashAttention-2 (Dao 2023): probabilities are
// recomputed block by block from the saved log-sum-exp, P = exp(scale·QKᵀ - lse), and with
// D_i = dO_i·O_i the score gradient is dS = P ∘ (dO·Vᵀ - D). FlashAttention-2 accumulates dQ with
// atomics across key-block tasks; on a CPU that would serialise, so this file runs two race-free
// passes instead: one parallel over query blocks for dQ, one parallel over (kv head, key block)
// for dK and dV, which also sums the GQA query heads that share a kv head without contention.
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
};

// D_i = dO_i · O_i for the rows of one query block of head h.
inline void row_dots(float* D, const float* dout, const float* out, const Dims& d, int64_t b, int64_t h,
                     int64_t i0, int64_t nq) {
  for (int64_t r = 0; r < nq; ++r) {
    const float* x = dout + (b * d.T + i0 + r) * d.OS + h * d.hd;
    const float* y = out + (b * d.T + i0 + r) * d.OS + h * d.hd;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t e = 0; e < d.hd; ++e) s += x[e] * y[e];
    D[r] = s;
  }
}

// dQ for every (batch, head, query block).
void backward_dq(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                 const Dims& d) {
#pragma omp parallel
  {
    float* Kt = scratch<float, 1>(size_t(2 * d.hd * BL + BL * d.hdp + 2 * BL * BL + BL * d.hdp + BL));
    float* Vt = Kt + d.hd * BL;
    float* Kp = Vt + d.hd * BL;
    float* Sc = Kp + BL * d.hdp;
    float* dP = Sc + BL * BL;
    float* dQ = dP + BL * BL;
    float* Drow = dQ + BL * d.hdp;
    const float* qrows[BL];
    const float* orows[BL];
    const float* krows[BL];
    const float* vrows[BL];

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < d.B * d.H * d.nblk; ++task) {
      const int64_t qb = d.nblk - 1 - task % d.nblk;
      const int64_t h = (task / d.nblk) % d.H;
      const int64_t b = task / (d.nblk * d.H);
      const int64_t g = h / d.rep;
      const int64_t i0 = qb * BL, nq = std::min(BL, d.T - i0);
      const int64_t rows = round_up(nq, kTileRows);
      const float* base = qkv + b * d.T * d.S;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = i0 + std::min(r, nq - 1);
        qrows[r] = base + i * d.S + h * d.hd;
        orows[r] = dout + (b * d.T + i) * d.OS + h * d.hd;
      }
      row_dots(Drow, dout, out, d, b, h, i0, nq);
      const float* L = lse + (b * d.H + h) * d.T + i0;
      std::fill(dQ, dQ + rows * d.hdp, 0.0f);

      const int64_t kend = i0 + nq;
      for (int64_t j0 = 0; j0 < kend; j0 += BL) {
        const int64_t nk = std::min(BL, kend - j0);
        for (int64_t j = 0; j < nk; ++j) {
          krows[j] = base + (j0 + j) * d.S + (d.H + g) * d.hd;
          vrows[j] = base + (j0 + j) * d.S + (d.H + d.KV + g) * d.hd;
        }
        pack_transposed(Kt, krows, nk, d.hd);
        pack_transposed(Vt, vrows, nk, d.hd);
        pack_rows(Kp, krows, nk, d.hd, d.hdp);
        block_abt(Sc, qrows, Kt, d.hd, rows);  // scores
        block_abt(dP, orows, Vt, d.hd, rows);  // dO·Vᵀ
        for (int64_t r = 0; r < rows; ++r) {
          float* s = Sc + r * BL;
          const float* dp = dP + r * BL;
          const int64_t valid = r < nq ? std::min(nk, i0 + r - j0 + 1) : 0;
          const float l = r < nq ? L[r] : 0.0f, Dr = r < nq ? Drow[r] : 0.0f;
#pragma omp simd
          for (int64_t j = 0; j < valid; ++j) {
            const float p = exp_approx(s[j] * d.scale - l);
            s[j] = p * (dp[j] - Dr) * d.scale;  // dS, with the score scale folded in
          }
          for (int64_t j = valid; j < BL; ++j) s[j] = 0.0f;
        }
        block_pm(dQ, d.hdp, Sc, Kp, d.hdp, rows, d.hdp, nk);
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

// dK and dV for every (batch, kv head, key block), summing over the query heads of the group.
void backward_dkv(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                  const Dims& d) {
#pragma omp parallel
  {
    float* Qt = scratch<float, 2>(size_t(2 * d.hd * BL + 2 * BL * d.hdp + 2 * BL * BL + 2 * BL * d.hdp + BL));
    float* dOt = Qt + d.hd * BL;
    float* Qp = dOt + d.hd * BL;
    float* dOp = Qp + BL * d.hdp;
    float* Pt = dOp + BL * d.hdp;
    float* dSt = Pt + BL * BL;
    float* dK = dSt + BL * BL;
    float* dV = dK + BL * d.hdp;
    float* Drow = dV + BL * d.hdp;
    const float* krows[BL];
    const float* vrows[BL];
    const float* qrows[BL];
    const float* orows[BL];

    // Key block 0 sees every query block: heaviest first.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < d.B * d.KV * d.nblk; ++task) {
      const int64_t kb = task % d.nblk;
      const int64_t g = (task / d.nblk) % d.KV;
      const int64_t b = task / (d.nblk * d.KV);
      const int64_t j0 = kb * BL, nk = std::min(BL, d.T - j0);
      const int64_t rows = round_up(nk, kTileRows);
      const float* base = qkv + b * d.T * d.S;
      for (int64_t j = 0; j < rows; ++j) {
        const int64_t jj = j0 + std::min(j, nk - 1);
        krows[j] = base + jj * d.S + (d.H + g) * d.hd;
        vrows[j] = base + jj * d.S + (d.H + d.KV + g) * d.hd;
      }
      std::fill(dK, dK + rows * d.hdp, 0.0f);
      std::fill(dV, dV + rows * d.hdp, 0.0f);

      for (int64_t h = g * d.rep; h < (g + 1) * d.rep; ++h) {
        const float* L = lse + (b * d.H + h) * d.T;
        for (int64_t i0 = j0; i0 < d.T; i0 += BL) {  // causal: queries from the key block on
          const int64_t nq = std::min(BL, d.T - i0);
          for (int64_t r = 0; r < nq; ++r) {
            qrows[r] = base + (i0 + r) * d.S + h * d.hd;
            orows[r] = dout + (b * d.T + i0 + r) * d.OS + h * d.hd;
          }
          row_dots(Drow, dout, out, d, b, h, i0, nq);
          pack_transposed(Qt, qrows, nq, d.hd);
          pack_transposed(dOt, orows, nq, d.hd);
          pack_rows(Qp, qrows, nq, d.hd, d.hdp);
          pack_rows(dOp, orows, nq, d.hd, d.hdp);
          block_abt(Pt, krows, Qt, d.hd, rows);   // Sᵀ = K·Qᵀ
          block_abt(dSt, vrows, dOt, d.hd, rows);  // dPᵀ = V·dOᵀ
          for (int64_t j = 0; j < rows; ++j) {
            float* p = Pt + j * BL;
            float* ds = dSt + j * BL;
            // Query r is visible to key j0 + j when i0 + r >= j0 + j.
            const int64_t first = j < nk ? std::max<int64_t>(0, j0 + j - i0) : nq;
            for (int64_t r = 0; r < first; ++r) p[r] = ds[r] = 0.0f;
#pragma omp simd
            for (int64_t r = first; r < nq; ++r) {
              const float pr = exp_approx(p[r] * d.scale - L[i0 + r]);
              p[r] = pr;
              ds[r] = pr * (ds[r] - Drow[r]) * d.scale;
            }
            for (int64_t r = std::max(first, nq); r < BL; ++r) p[r] = ds[r] = 0.0f;
          }
          block_pm(dV, d.hdp, Pt, dOp, d.hdp, rows, d.hdp, nq);
          block_pm(dK, d.hdp, dSt, Qp, d.hdp, rows, d.hdp, nq);
        }
      }
      for (int64_t j = 0; j < nk; ++j) {
        float* dk = dqkv + (b * d.T + j0 + j) * d.S + (d.H + g) * d.hd;
        float* dv = dqkv + (b * d.T + j0 + j) * d.S + (d.H + d.KV + g) * d.hd;
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
         1.0f / std::sqrt(float(hd))};
  backward_dq(dqkv, dout, qkv, out, lse, d);
  backward_dkv(dqkv, dout, qkv, out, lse, d);
}

}  // namespace atl::cpu
