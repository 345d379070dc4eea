// Causal self-attention forward, blocked with an online softmax (FlashAttention: Dao et al. 2022;
// the loop order of FlashAttention-2, Dao 2023: each task owns one query block of one head and
// walks the key blocks up to the diagonal), so the T×T score matrix is never stored. Grouped-query
// attention (Ainslie et al. 2023): query head h reads kv head h / (H/KV). Saves the row
// log-sum-exp for the backward pass.
//
// CPU layout choice: the task packs its query block transposed once and computes scores
// transposed, Sᵀ = K·Qᵀ, so K and V are read in place (no per-block packing) and the softmax
// statistics of the 64 queries are updated as vectors across a row of Sᵀ.
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/attention_tiles.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H,
                       int64_t KV, int64_t hd) {
  using namespace detail;
  ATOLL_CHECK(KV > 0 && H % KV == 0, "attention: {} query heads are not a multiple of {} kv heads", H, KV);
  constexpr int64_t BL = kAttnBlock;
  const int64_t S = (H + 2 * KV) * hd;  // qkv row stride
  const int64_t OS = H * hd;            // out row stride
  const int64_t hdp = round_up(hd, 16);
  const int64_t nqb = (T + BL - 1) / BL;
  const int64_t rep = H / KV;
  const float scale = 1.0f / std::sqrt(float(hd));

#pragma omp parallel if(parallel : B * H * T * T * hd / 2 >= detail::kMinParallelWork)
  {
    // Per-thread scratch: Qᵀ, Sᵀ/Pᵀ, output accumulator, padded V (odd hd only), softmax state.
    float* Qt = scratch<float, 0>(size_t(hd * BL + BL * BL + 2 * BL * hdp + 4 * BL));
    float* St = Qt + hd * BL;
    float* O = St + BL * BL;
    float* Vpad = O + BL * hdp;
    float* mrow = Vpad + BL * hdp;
    float* lrow = mrow + BL;
    float* mblk = lrow + BL;
    float* alpha = mblk + BL;
    const float* rows[BL];

    // Heaviest (last) query blocks first so that dynamic scheduling ends evenly.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * H * nqb; ++task) {
      const int64_t qb = nqb - 1 - task % nqb;
      const int64_t h = (task / nqb) % H;
      const int64_t b = task / (nqb * H);
      const int64_t g = h / rep;
      const int64_t i0 = qb * BL, nq = std::min(BL, T - i0);
      const int64_t qrows = round_up(nq, kTileRows);
      const float* base = qkv + b * T * S;
      for (int64_t r = 0; r < nq; ++r) rows[r] = base + (i0 + r) * S + h * hd;
      pack_transposed(Qt, rows, nq, hd);  // columns >= nq are zero: finite, ignored scores
      std::fill(O, O + qrows * hdp, 0.0f);
      std::fill(mrow, mrow + BL, -INFINITY);
      std::fill(lrow, lrow + BL, 0.0f);

      const int64_t kend = i0 + nq;  // causal: keys up to the last query of the block
      for (int64_t j0 = 0; j0 < kend; j0 += BL) {
        const int64_t nk = std::min(BL, kend - j0);
        const int64_t krows = round_up(nk, kTileRows);
        for (int64_t j = 0; j < krows; ++j) rows[j] = base + (j0 + std::min(j, nk - 1)) * S + (H + g) * hd;
        block_abt(St, rows, Qt, hd, krows);  // Sᵀ[j][r] = k_j · q_r

        // Scale and mask (query r sees key j when i0 + r >= j0 + j), then the block's column max.
        std::fill(mblk, mblk + BL, -INFINITY);
        for (int64_t j = 0; j < nk; ++j) {
          float* s = St + j * BL;
          const int64_t rmin = std::max<int64_t>(0, j0 + j - i0);
          for (int64_t r = 0; r < rmin; ++r) s[r] = -INFINITY;
#pragma omp simd
          for (int64_t r = rmin; r < BL; ++r) {
            s[r] *= scale;
            mblk[r] = std::max(mblk[r], s[r]);
          }
        }
        // Every column has a visible key in every block it meets, so mblk is finite.
#pragma omp simd
        for (int64_t r = 0; r < BL; ++r) {
          const float mnew = std::max(mrow[r], mblk[r]);
          alpha[r] = exp_approx(mrow[r] - mnew);
          mrow[r] = mnew;
          lrow[r] *= alpha[r];
        }
        for (int64_t j = 0; j < nk; ++j) {
          float* s = St + j * BL;
#pragma omp simd
          for (int64_t r = 0; r < BL; ++r) {
            const float p = exp_approx(s[r] - mrow[r]);
            s[r] = p;
            lrow[r] += p;
          }
        }
        for (int64_t r = 0; r < qrows; ++r) {
          float* o = O + r * hdp;
          const float a = alpha[r];
#pragma omp simd
          for (int64_t e = 0; e < hdp; ++e) o[e] *= a;
        }
        int64_t ldv;
        const float* V = rows_operand(base + j0 * S + (H + KV + g) * hd, S, nk, hd, hdp, Vpad, &ldv);
        block_pm(O, hdp, St, 1, BL, V, ldv, qrows, hdp, nk);  // O += P·V with P = (Sᵀ)ᵀ
      }

      for (int64_t r = 0; r < nq; ++r) {
        const float inv = 1.0f / lrow[r];
        float* dst = out + (b * T + i0 + r) * OS + h * hd;
        const float* o = O + r * hdp;
#pragma omp simd
        for (int64_t e = 0; e < hd; ++e) dst[e] = o[e] * inv;
        lse[(b * H + h) * T + i0 + r] = mrow[r] + std::log(lrow[r]);
      }
    }
  }
}

}  // namespace atl::cpu
