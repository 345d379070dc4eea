// Causal self-attention forward, blocked with an online softmax (FlashAttention: Dao et al. 2022;
// the loop order of FlashAttention-2, Dao 2023: each task owns one query block of one head and
// walks the key blocks up to the diagonal), so the T×T score matrix is never stored. Grouped-query
// attention (Ainslie et al. 2023): query head h reads kv head h / (H/KV). Saves the row
// log-sum-exp for the backward pass.
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

#pragma omp parallel
  {
    // Per-thread scratch: Kᵀ block, V block, scores/probabilities, output accumulator, m, l.
    float* Kt = scratch<float, 0>(size_t(hd * BL + BL * hdp + BL * BL + BL * hdp + 2 * BL));
    float* Vp = Kt + hd * BL;
    float* Sc = Vp + BL * hdp;
    float* O = Sc + BL * BL;
    float* mrow = O + BL * hdp;
    float* lrow = mrow + BL;
    const float* qrows[BL];
    const float* krows[BL];
    const float* vrows[BL];

    // Heaviest (last) query blocks first so that dynamic scheduling ends evenly.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < B * H * nqb; ++task) {
      const int64_t qb = nqb - 1 - task % nqb;
      const int64_t h = (task / nqb) % H;
      const int64_t b = task / (nqb * H);
      const int64_t g = h / rep;
      const int64_t i0 = qb * BL, nq = std::min(BL, T - i0);
      const int64_t rows = round_up(nq, kTileRows);
      const float* base = qkv + b * T * S;
      for (int64_t r = 0; r < rows; ++r) qrows[r] = base + (i0 + std::min(r, nq - 1)) * S + h * hd;
      std::fill(O, O + rows * hdp, 0.0f);
      std::fill(mrow, mrow + BL, -INFINITY);
      std::fill(lrow, lrow + BL, 0.0f);

      const int64_t kend = i0 + nq;  // causal: keys up to the last query of the block
      for (int64_t j0 = 0; j0 < kend; j0 += BL) {
        const int64_t nk = std::min(BL, kend - j0);
        for (int64_t j = 0; j < nk; ++j) {
          krows[j] = base + (j0 + j) * S + (H + g) * hd;
          vrows[j] = base + (j0 + j) * S + (H + KV + g) * hd;
        }
        pack_transposed(Kt, krows, nk, hd);
        pack_rows(Vp, vrows, nk, hd, hdp);
        block_abt(Sc, qrows, Kt, hd, rows);

        for (int64_t r = 0; r < rows; ++r) {
          float* s = Sc + r * BL;
          if (r >= nq) {  // padding rows: keep them finite and inert
            std::fill(s, s + BL, 0.0f);
            continue;
          }
          const int64_t valid = std::min(nk, i0 + r - j0 + 1);  // >= 1: key j0 <= query i0 + r
          float mb = -INFINITY;
#pragma omp simd reduction(max : mb)
          for (int64_t j = 0; j < valid; ++j) mb = std::max(mb, s[j] * scale);
          const float mnew = std::max(mrow[r], mb);
          const float alpha = exp_approx(mrow[r] - mnew);
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < valid; ++j) {
            const float p = exp_approx(s[j] * scale - mnew);
            s[j] = p;
            sum += p;
          }
          for (int64_t j = valid; j < BL; ++j) s[j] = 0.0f;
          lrow[r] = lrow[r] * alpha + sum;
          mrow[r] = mnew;
          float* o = O + r * hdp;
#pragma omp simd
          for (int64_t e = 0; e < hdp; ++e) o[e] *= alpha;
        }
        block_pm(O, hdp, Sc, Vp, hdp, rows, hdp, nk);
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
