// Helpers private to the CPU kernels: a branch-free exp that the compiler vectorises (glibc's expf
// only vectorises under -ffast-math, which atoll does not use), and per-thread scratch buffers
// that grow once so that the hot path never allocates.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace atl::cpu::detail {

// Below this many elements of work a kernel runs on the calling thread: forking a team costs
// microseconds (far more when cores are oversubscribed) and tiny calls cannot amortise it.
constexpr int64_t kMinParallelWork = int64_t(1) << 15;

// exp(x) by Cody-Waite range reduction, x = n*ln2 + r with |r| <= ln2/2, and Cephes' degree-5
// polynomial for exp(r); about 1 ulp over the normal range. x below -87.3 (including -inf)
// gives 0, x above 88 saturates at exp(88); NaN is not propagated (callers never pass one).
inline float exp_approx(float x) {
  float xc = x < -87.3f ? -87.3f : x;  // ternaries, not fmin/fmax: they map to vmaxps/vminps
  xc = xc > 88.0f ? 88.0f : xc;
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
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x < -87.3f ? 0.0f : p * scale;
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
