// Register-blocked tile products shared by the blocked attention kernels (attention_forward.cpp,
// attention_backward.cpp). Written with GCC vector extensions rather than intrinsics so that they
// compile for any target: with AVX-512 a v16f is one zmm register, on narrower targets the
// compiler splits it. Private to the kernels layer.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>

#pragma GCC diagnostic ignored "-Wpsabi"  // 64-byte vectors by value: every use here is inlined

namespace atl::cpu::detail {

constexpr int64_t kAttnBlock = 64;  // query and key block size; also the width of tile_abt
constexpr int kTileRows = 4;        // rows per register tile

typedef float v16f __attribute__((vector_size(64)));

inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store16(float* p, v16f v) { std::memcpy(p, &v, sizeof v); }

// C[r][0..64) = sum_d A_r[d] * Bt[d][0..64) for r < 4; A's rows are given as pointers (they are
// strided heads inside a packed qkv/out buffer), Bt is packed [K][64]. C has row stride 64.
inline void tile_abt(float* C, const float* const* arows, const float* Bt, int64_t K) {
  v16f acc[kTileRows][4] = {};
  const float* a0 = arows[0];
  const float* a1 = arows[1];
  const float* a2 = arows[2];
  const float* a3 = arows[3];
  for (int64_t d = 0; d < K; ++d) {
    const float* b = Bt + d * kAttnBlock;
    const v16f b0 = load16(b), b1 = load16(b + 16), b2 = load16(b + 32), b3 = load16(b + 48);
    const float s[kTileRows] = {a0[d], a1[d], a2[d], a3[d]};
    for (int r = 0; r < kTileRows; ++r) {
      acc[r][0] += s[r] * b0;
      acc[r][1] += s[r] * b1;
      acc[r][2] += s[r] * b2;
      acc[r][3] += s[r] * b3;
    }
  }
  for (int r = 0; r < kTileRows; ++r)
    for (int q = 0; q < 4; ++q) store16(C + r * kAttnBlock + 16 * q, acc[r][q]);
}

// O[r][0..16*NV) += sum_{j<n} P(r, j) * M[j][0..16*NV) for r < 4, with P(r, j) = P[r*prs + j*pcs]
// (so a transposed P costs nothing), M row stride ldm, O row stride ldo.
template <int NV>
inline void tile_pm(float* O, int64_t ldo, const float* P, int64_t prs, int64_t pcs, const float* M, int64_t ldm,
                    int64_t n) {
  v16f acc[kTileRows][NV];
  for (int r = 0; r < kTileRows; ++r)
    for (int q = 0; q < NV; ++q) acc[r][q] = load16(O + r * ldo + 16 * q);
  for (int64_t j = 0; j < n; ++j) {
    v16f m[NV];
    for (int q = 0; q < NV; ++q) m[q] = load16(M + j * ldm + 16 * q);
    const float* pj = P + j * pcs;
    for (int r = 0; r < kTileRows; ++r) {
      const float p = pj[r * prs];
      for (int q = 0; q < NV; ++q) acc[r][q] += p * m[q];
    }
  }
  for (int r = 0; r < kTileRows; ++r)
    for (int q = 0; q < NV; ++q) store16(O + r * ldo + 16 * q, acc[r][q]);
}

// O[rows][0..width) += P[rows][0..n) · M[0..n)[0..width), width a multiple of 16, in column
// chunks of 64 so that each register tile stays at 16 accumulators.
inline void block_pm(float* O, int64_t ldo, const float* P, int64_t prs, int64_t pcs, const float* M, int64_t ldm,
                     int64_t rows, int64_t width, int64_t n) {
  for (int64_t r = 0; r < rows; r += kTileRows) {
    for (int64_t c = 0; c < width; c += 64) {
      float* o = O + r * ldo + c;
      const float* p = P + r * prs;
      const float* m = M + c;
      switch (std::min<int64_t>(4, (width - c) / 16)) {
        case 1: tile_pm<1>(o, ldo, p, prs, pcs, m, ldm, n); break;
        case 2: tile_pm<2>(o, ldo, p, prs, pcs, m, ldm, n); break;
        case 3: tile_pm<3>(o, ldo, p, prs, pcs, m, ldm, n); break;
        default: tile_pm<4>(o, ldo, p, prs, pcs, m, ldm, n); break;
      }
    }
  }
}

// C[rows][0..64) = A[rows] · Bt for rows a multiple of 4.
inline void block_abt(float* C, const float* const* arows, const float* Bt, int64_t K, int64_t rows) {
  for (int64_t r = 0; r < rows; r += kTileRows) tile_abt(C + r * kAttnBlock, arows + r, Bt, K);
}

// Packs up to 64 rows of length hd (row pointers) transposed into Bt[hd][64], zero beyond n.
inline void pack_transposed(float* Bt, const float* const* rows, int64_t n, int64_t hd) {
  for (int64_t d = 0; d < hd; ++d) {
    float* dst = Bt + d * kAttnBlock;
    for (int64_t j = 0; j < n; ++j) dst[j] = rows[j][d];
    for (int64_t j = n; j < kAttnBlock; ++j) dst[j] = 0.0f;
  }
}

// n rows of a head (uniform stride ld) as a tile_pm operand: read in place when hd is a multiple of
// the vector width, otherwise copied to `pad` with rows zero-padded to hdp. Returns the row stride.
inline const float* rows_operand(const float* first, int64_t ld, int64_t n, int64_t hd, int64_t hdp, float* pad,
                                 int64_t* ldm) {
  if (hd == hdp) {
    *ldm = ld;
    return first;
  }
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(pad + j * hdp, first + j * ld, size_t(hd) * sizeof(float));
    for (int64_t e = hd; e < hdp; ++e) pad[j * hdp + e] = 0.0f;
  }
  *ldm = hdp;
  return pad;
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

}  // namespace atl::cpu::detail
