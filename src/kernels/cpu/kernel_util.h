// Helpers private to the CPU kernels: a branch-free exp that the compiler vectorises (glibc's expf
// only vectorises under -ffast-math, which atoll does not use), its row sum in a fixed order, and
// per-thread scratch buffers that grow once so that the hot path never allocates.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace atl::cpu::detail {

// Below this many elements of work a kernel runs on the calling thread: forking a team costs
// microseconds (far more when cores are oversubscribed) and tiny calls cannot amortise it.
constexpr int64_t kMinParallelWork = int64_t(1) << 15;

// f32 -> bf16 bits, rounded to nearest even; NaNs stay quiet NaNs (tensor/dtype.h's
// float_to_bf16 rule, written branch-free so that loops over it vectorise).
inline uint16_t bf16_round_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// A float's bits as an int32 key that orders like the float (non-NaN), and back: negative floats
// are sign-magnitude, so their magnitude bits are flipped. Clamping a key is integer min/max.
inline int32_t float_order_key(float x) {
  const int32_t i = std::bit_cast<int32_t>(x);
  return i >= 0 ? i : i ^ 0x7fffffff;
}
inline float from_order_key(int32_t k) { return std::bit_cast<float>(k >= 0 ? k : k ^ 0x7fffffff); }

// exp(x) by Cody-Waite range reduction, x = n*ln2 + r with |r| <= ln2/2, and Cephes' degree-5
// polynomial for exp(r); about 1 ulp over the normal range. x below -87.3 (including -inf)
// gives 0, x above 88 saturates at exp(88); NaN is not propagated (callers never pass one).
//
// The clamp to [-87.3, 88] is integer min/max on order keys, not float ternaries: without
// -ffinite-math-only GCC keeps `x < lo ? lo : x` a branch around the polynomial, which it may not
// speculate (it could raise an FP exception) without AVX-512's masked arithmetic, so under the
// portable build's AVX2 every loop calling this stayed scalar (GELU, softmax, cross-entropy 3-4x
// slower than a native build's). The clamped value is the same float, so the result is the same.
inline float exp_approx(float x) {
  constexpr int32_t lo = std::bit_cast<int32_t>(-87.3f) ^ 0x7fffffff, hi = std::bit_cast<int32_t>(88.0f);
  const int32_t k = float_order_key(x);
  const float xc = from_order_key(k < lo ? lo : k > hi ? hi : k);
  // Rounds x*log2(e) to the nearest integer with the 1.5*2^23 trick (no call, so it vectorises).
  const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;  // ln2 split in two so that n*ln2 is exact enough
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((int32_t(n) + 127) << 23);
  // x < -87.3 gives +0 by masking the bits, not by a ternary, which GCC would turn into a branch
  // around the whole computation above (the same vectorisation problem as the clamp's).
  const int32_t keep = -int32_t(k >= lo);
  return std::bit_cast<float>(std::bit_cast<int32_t>(p * scale) & keep);
}

// Σ exp(x[i] - m) over [0, n), added one by one in index order (the order the scalar loops these
// replace used, so every result keeps its bits: the multi-rank tests' tolerances and bit-identity
// were set on it), with the exps computed 16 at a time in a vectorised loop. Out-of-order
// execution overlaps the serial additions with the next block's exps. An `omp simd reduction`
// would leave the order to the vectoriser (lane count, epilogue, possible peeling to align a
// pointer), so a row could round differently at another address or on another build.
// y, when not null, receives the exps.
inline float exp_sum_seq(float* y, const float* x, int64_t n, float m) {
  float e[16];
  float s = 0.0f;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
#pragma omp simd
    for (int l = 0; l < 16; ++l) e[l] = exp_approx(x[i + l] - m);
    for (int l = 0; l < 16; ++l) s += e[l];
    if (y) std::memcpy(y + i, e, sizeof e);
  }
  for (; i < n; ++i) {
    const float v = exp_approx(x[i] - m);
    if (y) y[i] = v;
    s += v;
  }
  return s;
}

// tanh from exp; the absolute error stays near 1e-7, which is what GELU's 1 + tanh needs.
inline float tanh_approx(float u) { return 1.0f - 2.0f / (1.0f + exp_approx(2.0f * u)); }

// A per-thread buffer of T that only ever grows: kernels call it once per call (outside their
// loops) or once per OpenMP thread.
template <typename T, int Slot = 0>
inline T* scratch(size_t n) {
  thread_local std::vector<T> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

// y += a·x for the row-wise attention kernels (ranged and block). Their dot product is dot_row
// (attention_tiles.h), compiled per ISA variant with a fixed summation order.
inline void axpy_row(float* y, float a, const float* x, int64_t n) {
#pragma omp simd
  for (int64_t e = 0; e < n; ++e) y[e] += a * x[e];
}

}  // namespace atl::cpu::detail
