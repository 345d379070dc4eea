// GELU with the tanh approximation used by GPT-2 (Hendrycks & Gimpel 2016):
// gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). tanh comes from a vectorisable
// exp (kernel_util.h) because libm's tanhf would keep these loops scalar.
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
    const float du = kS * (1.0f + 3.0f * kA * x * x);
    dinp[i] += dout[i] * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
}

}  // namespace atl::cpu
