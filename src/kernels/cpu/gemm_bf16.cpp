// bf16 × bf16 → fp32 matrix product. The fast path is a GotoBLAS-style blocked kernel (Goto & van
// de Geijn 2008: pack op(B) into column panels and op(A) into row panels, then a register-tile
// micro kernel) built on AVX-512 BF16's VDPBF16PS, which multiplies pairs of bf16 along k and
// accumulates in fp32; so both operands are packed with consecutive k values interleaved in each
// 32-bit lane. CPUs without the instruction widen to fp32 and use the BLAS: the same products
// (bf16 × bf16 is exact in fp32), only the summation order differs. Which path a product takes
// (this kernel, oneDNN's matmul or the widened one) is decided in gemm_bf16_select.cpp.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"

namespace atl::cpu {

namespace {

constexpr int64_t MR = 6;    // micro tile rows: 6 × 4 accumulators = 24 zmm registers
constexpr int64_t NR = 64;   // micro tile columns: four 16-lane fp32 vectors
constexpr int64_t KC = 768;  // k per packed block (B panel = 96 KiB, in L2); few blocks = few barriers
constexpr int64_t MC = 96;   // rows per task (A block = 144 KiB, stays in L2)

inline uint16_t at(const bf16* X, bool trans, int64_t ld, int64_t r, int64_t c) {
  return trans ? X[c * ld + r].bits : X[r * ld + c].bits;
}

// op(B)[k0.., n0..n0+64) → Bp[p][c][2]: lane c of pair p holds rows k0+2p (low) and k0+2p+1 (high).
void pack_b_panel(uint16_t* Bp, const bf16* B, bool tb, int64_t ldb, int64_t K, int64_t N, int64_t k0,
                  int64_t kc, int64_t n0) {
  const int64_t kp = (kc + 1) / 2, nc = std::min(NR, N - n0);
  for (int64_t p = 0; p < kp; ++p) {
    uint16_t* dst = Bp + p * NR * 2;
    const int64_t ka = k0 + 2 * p, kb = ka + 1;
    for (int64_t c = 0; c < nc; ++c) {
      dst[2 * c] = at(B, tb, ldb, ka, n0 + c);
      dst[2 * c + 1] = kb < k0 + kc ? at(B, tb, ldb, kb, n0 + c) : uint16_t(0);
    }
    for (int64_t c = nc; c < NR; ++c) dst[2 * c] = dst[2 * c + 1] = 0;
  }
}

// op(A)[m0..m0+6, k0..) → Ap[p][r]: one 32-bit word per row with the bf16 pair (k0+2p, k0+2p+1).
void pack_a_panel(uint32_t* Ap, const bf16* A, bool ta, int64_t lda, int64_t M, int64_t k0, int64_t kc,
                  int64_t m0) {
  const int64_t kp = (kc + 1) / 2, mr = std::min(MR, M - m0);
  for (int64_t p = 0; p < kp; ++p) {
    const int64_t ka = k0 + 2 * p, kb = ka + 1;
    for (int64_t r = 0; r < MR; ++r) {
      uint32_t w = 0;
      if (r < mr) {
        w = at(A, ta, lda, m0 + r, ka);
        if (kb < k0 + kc) w |= uint32_t(at(A, ta, lda, m0 + r, kb)) << 16;
      }
      Ap[p * MR + r] = w;
    }
  }
}

// C[0..mr, 0..nr) = alpha·acc + beta·C on the first k block (beta 0 never reads C), += alpha·acc after.
__attribute__((target("avx512f,avx512bf16"))) void micro_kernel(int64_t kp, const uint32_t* Ap,
                                                                   const uint16_t* Bp, float* C, int64_t ldc,
                                                                   int64_t mr, int64_t nr, float alpha,
                                                                   float beta, bool first) {
  __m512 acc[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int q = 0; q < 4; ++q) acc[r][q] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kp; ++p) {
    const uint16_t* b = Bp + p * NR * 2;
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 32);
    const __m512bh b2 = (__m512bh)_mm512_loadu_si512(b + 64);
    const __m512bh b3 = (__m512bh)_mm512_loadu_si512(b + 96);
    const uint32_t* a = Ap + p * MR;
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], av, b2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], av, b3);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int64_t r = 0; r < mr; ++r) {
    float* c = C + r * ldc;
    for (int q = 0; q < 4; ++q) {
      const int64_t left = nr - 16 * q;
      if (left <= 0) break;
      const __mmask16 k = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1);
      __m512 v = _mm512_mul_ps(acc[r][q], va);
      if (!first) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(k, c + 16 * q));
      else if (beta != 0.0f) v = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(k, c + 16 * q), v);
      _mm512_mask_storeu_ps(c + 16 * q, k, v);
    }
  }
}

}  // namespace

void gemm_bf16_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                      int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  ATOLL_CHECK(has_avx512_bf16(), "gemm_bf16_avx512: this CPU has no AVX-512 BF16");
  if (M == 0 || N == 0) return;
  if (K == 0) return gemm_bf16_portable(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const int64_t kpmax = (std::min(K, KC) + 1) / 2;
  const int64_t npan = (N + NR - 1) / NR, mpan = (M + MR - 1) / MR;
  const int64_t mblocks = (M + MC - 1) / MC;
  // Shared packed operands for one k block, in the calling thread's grow-once scratch.
  uint16_t* Bp = detail::scratch<uint16_t, 0>(size_t(npan * kpmax * NR * 2));
  uint32_t* Ap = detail::scratch<uint32_t, 0>(size_t(mpan * kpmax * MR));
#pragma omp parallel if(parallel : M * N * K / 8 >= detail::kMinParallelWork)
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t kc = std::min(KC, K - k0), kp = (kc + 1) / 2;
#pragma omp for schedule(static)
    for (int64_t x = 0; x < npan + mpan; ++x) {
      if (x < npan) pack_b_panel(Bp + x * kp * NR * 2, B, tb, ldb, K, N, k0, kc, x * NR);
      else pack_a_panel(Ap + (x - npan) * kp * MR, A, ta, lda, M, k0, kc, (x - npan) * MR);
    }
    // One task = MC rows × one 64-column panel: the B panel is reused by every micro tile.
#pragma omp for schedule(static) collapse(2)
    for (int64_t ib = 0; ib < mblocks; ++ib) {
      for (int64_t j = 0; j < npan; ++j) {
        const int64_t n0 = j * NR, nr = std::min(NR, N - n0);
        for (int64_t m0 = ib * MC; m0 < std::min(M, (ib + 1) * MC); m0 += MR) {
          micro_kernel(kp, Ap + (m0 / MR) * kp * MR, Bp + j * kp * NR * 2, C + m0 * ldc + n0, ldc,
                       std::min(MR, M - m0), nr, alpha, beta, k0 == 0);
        }
      }
    }
  }
}

bool has_avx512_bf16() { return cpu_features().avx512_bf16; }

void f32_to_bf16(const float* in, bf16* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) out[i].bits = detail::bf16_round_bits(in[i]);
}

void bf16_to_f32(const bf16* in, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(in[i].bits) << 16;
    std::memcpy(&out[i], &u, 4);
  }
}

void gemm_bf16_portable(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                        int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  // Widen the stored operands (their layout unchanged) and let sgemm do the rest.
  const int64_t arows = ta ? K : M, acols = ta ? M : K, brows = tb ? N : K, bcols = tb ? K : N;
  float* Af = detail::scratch<float, 10>(size_t(arows * acols));
  float* Bf = detail::scratch<float, 11>(size_t(brows * bcols));
#pragma omp parallel for schedule(static) if(parallel : M * K + K * N >= detail::kMinParallelWork)
  for (int64_t r = 0; r < arows + brows; ++r) {
    const bool is_a = r < arows;
    const bf16* src = is_a ? A + r * lda : B + (r - arows) * ldb;
    float* dst = is_a ? Af + r * acols : Bf + (r - arows) * bcols;
    const int64_t n = is_a ? acols : bcols;
    for (int64_t c = 0; c < n; ++c) dst[c] = bf16_to_float(src[c]);
  }
  gemm_openblas(ta, tb, M, N, K, alpha, Af, std::max<int64_t>(acols, 1), Bf, std::max<int64_t>(bcols, 1), beta, C, ldc);
}

}  // namespace atl::cpu
