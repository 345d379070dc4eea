// bf16 × bf16 → fp32 matrix product on AMX tiles (Intel AMX-BF16, Sapphire Rapids and later;
// Intel SDM vol. 1 ch. 3 "Intel AMX"): atoll's own kernel, measured against oneDNN's matmul on
// the training's shapes by `atoll bench gemm` (the faster one is what gemm_bf16 takes).
// TDPBF16PS multiplies a 16×32 bf16 A tile by a 32×16 B tile held as 16 rows of k-pairs (the
// VNNI layout) into a 16×16 fp32 tile. Both operands are packed once per call into whole tiles
// with zero padding (so the kernel has no edge cases), and each task computes a 32×32 block of C
// in four accumulator tiles over the full K, with two A and two B tiles (all 8 tiles in use).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"

namespace atl::cpu {

namespace {

constexpr int64_t kTileElems = 16 * 32;  // bf16 per A or B tile: 16 rows of 64 bytes

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

inline uint16_t at(const bf16* X, bool trans, int64_t ld, int64_t r, int64_t c) {
  return trans ? X[c * ld + r].bits : X[r * ld + c].bits;
}

// Panel i of op(A) (32 rows): tiles [kb][h] of 16 rows × 32 k, zero-padded.
void pack_a(uint16_t* dst, const bf16* A, bool ta, int64_t lda, int64_t M, int64_t K, int64_t nkb, int64_t i) {
  for (int64_t kb = 0; kb < nkb; ++kb)
    for (int64_t h = 0; h < 2; ++h) {
      uint16_t* t = dst + (kb * 2 + h) * kTileElems;
      for (int64_t r = 0; r < 16; ++r) {
        const int64_t m = i * 32 + h * 16 + r;
        for (int64_t kk = 0; kk < 32; ++kk) {
          const int64_t k = kb * 32 + kk;
          t[r * 32 + kk] = (m < M && k < K) ? at(A, ta, lda, m, k) : uint16_t(0);
        }
      }
    }
}

// Panel j of op(B) (32 columns): tiles [kb][h] of 16 k-pairs × 16 columns × 2.
void pack_b(uint16_t* dst, const bf16* B, bool tb, int64_t ldb, int64_t N, int64_t K, int64_t nkb, int64_t j) {
  for (int64_t kb = 0; kb < nkb; ++kb)
    for (int64_t h = 0; h < 2; ++h) {
      uint16_t* t = dst + (kb * 2 + h) * kTileElems;
      for (int64_t r = 0; r < 16; ++r)
        for (int64_t e = 0; e < 2; ++e) {
          const int64_t k = kb * 32 + 2 * r + e;
          for (int64_t c = 0; c < 16; ++c) {
            const int64_t n = j * 32 + h * 16 + c;
            t[r * 32 + c * 2 + e] = (n < N && k < K) ? at(B, tb, ldb, k, n) : uint16_t(0);
          }
        }
    }
}

__attribute__((target("amx-tile,amx-bf16"))) void load_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  // GCC's ldtilecfg builtin does not tell the optimiser it reads the 64 bytes: without the
  // barrier the stores above are dropped and the instruction faults on an invalid config.
  __asm__ volatile("" : : "m"(cfg) : "memory");
  _tile_loadconfig(&cfg);
}

__attribute__((target("amx-tile"))) void release_tiles() { _tile_release(); }

// out[32][32] = Ap panel · Bp panel over nkb k blocks.
__attribute__((target("amx-tile,amx-bf16"))) void block_32x32(const uint16_t* Ap, const uint16_t* Bp, int64_t nkb,
                                                               float* out) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kb = 0; kb < nkb; ++kb) {
    const uint16_t* a = Ap + kb * 2 * kTileElems;
    const uint16_t* b = Bp + kb * 2 * kTileElems;
    _tile_loadd(4, a, 64);
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(7, b + kTileElems, 64);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a + kTileElems, 64);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  // out rows 0-15: tiles 0 | 1, rows 16-31: tiles 2 | 3 (row stride 32 floats = 128 bytes).
  _tile_stored(0, out, 128);
  _tile_stored(1, out + 16, 128);
  _tile_stored(2, out + 16 * 32, 128);
  _tile_stored(3, out + 16 * 32 + 16, 128);
}

}  // namespace

void gemm_bf16_amx(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                   const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  ATOLL_CHECK(isa_supported(Isa::amx), "gemm_bf16_amx: this CPU or OS cannot run AMX");
  if (M == 0 || N == 0) return;
  if (K == 0) return gemm_bf16_portable(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const int64_t nkb = (K + 31) / 32, mpan = (M + 31) / 32, npan = (N + 31) / 32;
  const int64_t panel = nkb * 2 * kTileElems;
  uint16_t* Ap = detail::scratch<uint16_t, 20>(size_t(mpan * panel));
  uint16_t* Bp = detail::scratch<uint16_t, 21>(size_t(npan * panel));
#pragma omp parallel if(parallel : M * N * K / 8 >= detail::kMinParallelWork)
  {
#pragma omp for schedule(static)
    for (int64_t x = 0; x < mpan + npan; ++x) {
      if (x < mpan) pack_a(Ap + x * panel, A, ta, lda, M, K, nkb, x);
      else pack_b(Bp + (x - mpan) * panel, B, tb, ldb, N, K, nkb, x - mpan);
    }
    load_config();
    alignas(64) float out[32 * 32];
    // j-major: a thread's consecutive blocks share one B panel, which stays in L1/L2.
#pragma omp for schedule(static)
    for (int64_t x = 0; x < mpan * npan; ++x) {
      const int64_t j = x / mpan, i = x % mpan;
      block_32x32(Ap + i * panel, Bp + j * panel, nkb, out);
      const int64_t m0 = i * 32, n0 = j * 32, mr = std::min<int64_t>(32, M - m0), nr = std::min<int64_t>(32, N - n0);
      for (int64_t r = 0; r < mr; ++r) {
        float* c = C + (m0 + r) * ldc + n0;
        const float* o = out + r * 32;
        if (beta == 0.0f) {
          for (int64_t q = 0; q < nr; ++q) c[q] = alpha * o[q];
        } else {
          for (int64_t q = 0; q < nr; ++q) c[q] = alpha * o[q] + beta * c[q];
        }
      }
    }
    release_tiles();
  }
}

}  // namespace atl::cpu
