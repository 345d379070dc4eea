// Register-blocked tile products shared by the blocked attention kernels (attention_forward.inc,
// attention_backward.inc). Written with GCC vector extensions rather than intrinsics, and compiled
// once per ISA variant: attention_variants.h includes this file inside each variant's namespace
// with `vec` (v8f for AVX2, v16f for AVX-512), kLanes and kTileVecs defined. A tile is kTileRows
// rows by kTileVecs vectors of accumulators, sized to the register file: 4×4 zmm (16 of 32) with
// AVX-512, 4×3 ymm (12 of 16, leaving room for the operands) with AVX2. A tile of zmm-sized
// vectors under AVX2 would need 32 ymm registers and spill every accumulator to the stack, which
// made the portable build 13× slower than a native one.
//
// Summation order: every output element is one lane, summed over the inner index (d or j) in
// order from its initial value, one fused multiply-add per term. The tile shape only changes which
// elements share a register, so both variants give bit-identical tile products.
//
// No include guard and no includes: attention_variants.h includes it once per variant, after the
// standard headers it needs.

constexpr int64_t kAttnBlock = 64;  // query and key block size; also the width of tile_abt's Bt
constexpr int kTileRows = 4;        // rows per register tile; callers round row counts up to it
static_assert(16 % kLanes == 0, "head dims are padded to 16 floats, a whole number of vectors");

inline vec loadv(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void storev(float* p, vec v) { std::memcpy(p, &v, sizeof v); }

// C[r][0..NV*kLanes) = sum_d A_r[d] * Bt[d][0..NV*kLanes) for r < 4; A's rows are given as pointers
// (they are strided heads inside a packed qkv/out buffer), Bt has row stride 64, C row stride 64.
template <int NV>
inline void tile_abt(float* C, const float* const* arows, const float* Bt, int64_t K) {
  vec acc[kTileRows][NV] = {};
  const float* a0 = arows[0];
  const float* a1 = arows[1];
  const float* a2 = arows[2];
  const float* a3 = arows[3];
  for (int64_t d = 0; d < K; ++d) {
    const float* b = Bt + d * kAttnBlock;
    vec bv[NV];
    for (int q = 0; q < NV; ++q) bv[q] = loadv(b + kLanes * q);
    const float s[kTileRows] = {a0[d], a1[d], a2[d], a3[d]};
    for (int r = 0; r < kTileRows; ++r)
      for (int q = 0; q < NV; ++q) acc[r][q] += s[r] * bv[q];
  }
  for (int r = 0; r < kTileRows; ++r)
    for (int q = 0; q < NV; ++q) storev(C + r * kAttnBlock + kLanes * q, acc[r][q]);
}

// O[r][0..NV*kLanes) += sum_{j<n} P(r, j) * M[j][0..NV*kLanes) for r < 4, with
// P(r, j) = P[r*prs + j*pcs] (so a transposed P costs nothing), M row stride ldm, O row stride ldo.
template <int NV>
inline void tile_pm(float* O, int64_t ldo, const float* P, int64_t prs, int64_t pcs, const float* M, int64_t ldm,
                    int64_t n) {
  vec acc[kTileRows][NV];
  for (int r = 0; r < kTileRows; ++r)
    for (int q = 0; q < NV; ++q) acc[r][q] = loadv(O + r * ldo + kLanes * q);
  for (int64_t j = 0; j < n; ++j) {
    vec m[NV];
    for (int q = 0; q < NV; ++q) m[q] = loadv(M + j * ldm + kLanes * q);
    const float* pj = P + j * pcs;
    for (int r = 0; r < kTileRows; ++r) {
      const float p = pj[r * prs];
      for (int q = 0; q < NV; ++q) acc[r][q] += p * m[q];
    }
  }
  for (int r = 0; r < kTileRows; ++r)
    for (int q = 0; q < NV; ++q) storev(O + r * ldo + kLanes * q, acc[r][q]);
}

// O[rows][0..width) += P[rows][0..n) · M[0..n)[0..width), width a multiple of 16, in column
// chunks of at most kTileVecs vectors so that each tile stays in registers.
inline void block_pm(float* O, int64_t ldo, const float* P, int64_t prs, int64_t pcs, const float* M, int64_t ldm,
                     int64_t rows, int64_t width, int64_t n) {
  for (int64_t r = 0; r < rows; r += kTileRows) {
    for (int64_t c = 0; c < width; c += kTileVecs * kLanes) {
      float* o = O + r * ldo + c;
      const float* p = P + r * prs;
      const float* m = M + c;
      switch (std::min<int64_t>(kTileVecs, (width - c) / kLanes)) {
        case 1: tile_pm<1>(o, ldo, p, prs, pcs, m, ldm, n); break;
        case 2: tile_pm<2>(o, ldo, p, prs, pcs, m, ldm, n); break;
        case 3: tile_pm<3>(o, ldo, p, prs, pcs, m, ldm, n); break;
        default: tile_pm<kTileVecs>(o, ldo, p, prs, pcs, m, ldm, n); break;
      }
    }
  }
}

// C[rows][0..64) = A[rows] · Bt for rows a multiple of 4.
inline void block_abt(float* C, const float* const* arows, const float* Bt, int64_t K, int64_t rows) {
  for (int64_t r = 0; r < rows; r += kTileRows) {
    for (int64_t c = 0; c < kAttnBlock; c += kTileVecs * kLanes) {
      float* o = C + r * kAttnBlock + c;
      switch (std::min<int64_t>(kTileVecs, (kAttnBlock - c) / kLanes)) {
        case 1: tile_abt<1>(o, arows + r, Bt + c, K); break;
        case 2: tile_abt<2>(o, arows + r, Bt + c, K); break;
        case 3: tile_abt<3>(o, arows + r, Bt + c, K); break;
        default: tile_abt<kTileVecs>(o, arows + r, Bt + c, K); break;
      }
    }
  }
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
// 16, otherwise copied to `pad` with rows zero-padded to hdp. Returns the row stride in *ldm.
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

// a·b over n floats in a fixed order: kLanes partial sums over whole vectors from element 0, added
// lane 0 first, then the tail in order. Unlike an `omp simd reduction`, which GCC may peel to align
// a pointer, the order never depends on where the rows sit in memory, so the same inputs in
// another buffer (a tensor-parallel copy, a ring block) give the same bits.
inline float dot_row(const float* a, const float* b, int64_t n) {
  vec acc = {};
  int64_t e = 0;
  for (; e + kLanes <= n; e += kLanes) acc += loadv(a + e) * loadv(b + e);
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  for (; e < n; ++e) s += a[e] * b[e];
  return s;
}

// D = dO·O of the causal backward, in the order the portable build's 8-lane `omp simd` reduction
// used before the ISA variants existed (8 partial sums; halves, then pairs, then the two; then the
// tail in order), in both variants: the training curves of the multi-rank tests were tuned on it.
inline float dot_row8(const float* a, const float* b, int64_t n) {
  typedef float v8 __attribute__((vector_size(32)));
  v8 acc = {};
  int64_t e = 0;
  for (; e + 8 <= n; e += 8) {
    v8 x, y;
    std::memcpy(&x, a + e, sizeof x);
    std::memcpy(&y, b + e, sizeof y);
    acc += x * y;
  }
  const float t0 = acc[0] + acc[4], t1 = acc[1] + acc[5], t2 = acc[2] + acc[6], t3 = acc[3] + acc[7];
  float s = (t0 + t2) + (t1 + t3);
  for (; e < n; ++e) s += a[e] * b[e];
  return s;
}
