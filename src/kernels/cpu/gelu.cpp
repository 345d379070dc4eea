// GELU with the tanh approximation used by GPT-2 (Hendrycks & Gimpel 2016):
// gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). tanh comes from a vectorisable
// exp (kernel_util.h) because libm's tanhf would keep these loops scalar.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/gelu_bf16.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

namespace {
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;

inline float gelu_tanh(float x) { return detail::tanh_approx(kS * (x + kA * x * x * x)); }

// d gelu / dx at x, given t = gelu_tanh(x). Written with explicit fmas in the contraction GCC chose
// for the scalar loop (which this was before exp_approx vectorised): left to itself, GCC contracts
// the vectorised loop differently, and a tenth of the gradients lost their former bits (the
// multi-rank tests' bounds sit on them).
inline float gelu_slope(float x, float t) {
  const float du = kS * std::fma(3.0f * kA * x, x, 1.0f);
  return std::fma(du, (0.5f * x) * std::fma(-t, t, 1.0f), (1.0f + t) * 0.5f);
}

// cpu::f32_to_bf16's rounding (nearest even, NaN kept quiet), branch-free so the loop vectorises.
inline uint16_t bf16_bits(float f) { return detail::bf16_round_bits(f); }
inline float widen(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + gelu_tanh(x));
  }
}

void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    dinp[i] = std::fma(gelu_slope(x, gelu_tanh(x)), dout[i], dinp[i]);
  }
}

void gelu_forward_keep_bf16(float* out, bf16* saved, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + gelu_tanh(x));
    saved[i].bits = bf16_bits(x);
  }
}

void gelu_forward_keep_bf16(float* out, bf16* out_bf16, bf16* saved, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float y = 0.5f * x * (1.0f + gelu_tanh(x));
    out[i] = y;
    out_bf16[i].bits = bf16_bits(y);
    saved[i].bits = bf16_bits(x);
  }
}

void gelu_backward_bf16_rows(float* dinp, bf16* dinp_bf16, float* partials, const float* dout, const bf16* inp,
                             int64_t N, int64_t OC) {
  const int64_t nblk = (N + kBiasSumRows - 1) / kBiasSumRows;
#pragma omp parallel for schedule(static) if(parallel : N * OC >= detail::kMinParallelWork)
  for (int64_t blk = 0; blk < nblk; ++blk) {
    float* p = partials + blk * OC;
    for (int64_t o = 0; o < OC; ++o) p[o] = 0.0f;
    for (int64_t i = blk * kBiasSumRows; i < std::min(N, (blk + 1) * kBiasSumRows); ++i) {
      const bf16* xi = inp + i * OC;
      const float* di = dout + i * OC;
      float* gi = dinp + i * OC;
      bf16* bi = dinp_bf16 + i * OC;
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) {
        const float x = widen(xi[o].bits);
        const float g = gelu_slope(x, gelu_tanh(x)) * di[o];
        gi[o] = g;
        bi[o].bits = bf16_bits(g);
        p[o] += g;
      }
    }
  }
}

void gelu_backward_bf16(float* dinp, const float* dout, const bf16* inp, int64_t n, bool accumulate) {
  if (accumulate) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
    for (int64_t i = 0; i < n; ++i) {
      const float x = widen(inp[i].bits);
      dinp[i] = std::fma(gelu_slope(x, gelu_tanh(x)), dout[i], dinp[i]);
    }
    return;
  }
  // fma(s, d, 0) is s*d rounded once, the same bits as accumulating into a zeroed buffer (up to
  // the sign of a zero: -0 + 0 is +0).
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = widen(inp[i].bits);
    dinp[i] = gelu_slope(x, gelu_tanh(x)) * dout[i];
  }
}

}  // namespace atl::cpu
