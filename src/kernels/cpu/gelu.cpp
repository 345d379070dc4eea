// GELU with the tanh approximation used by GPT-2 (Hendrycks & Gimpel 2016):
// gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). tanh comes from a vectorisable
// exp (kernel_util.h) because libm's tanhf would keep these loops scalar.
#include <cmath>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

namespace {
constexpr float kS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;
}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float t = detail::tanh_approx(kS * (x + kA * x * x * x));
    out[i] = 0.5f * x * (1.0f + t);
  }
}

void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float t = detail::tanh_approx(kS * (x + kA * x * x * x));
    // Written with explicit fmas in the contraction GCC chose for the scalar loop (which this was
    // before exp_approx vectorised): left to itself, GCC contracts the vectorised loop differently,
    // and a tenth of the gradients lost their former bits (the multi-rank tests' bounds sit on them).
    const float du = kS * std::fma(3.0f * kA * x, x, 1.0f);
    const float e = std::fma(du, (0.5f * x) * std::fma(-t, t, 1.0f), (1.0f + t) * 0.5f);
    dinp[i] = std::fma(e, dout[i], dinp[i]);
  }
}

}  // namespace atl::cpu
