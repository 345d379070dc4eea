// SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"): out = silu(gate) * up with the input
// row laid out [gate | up]; sigmoid from the vectorisable exp in kernel_util.h.
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

void swiglu_forward(float* out, const float* inp, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if(parallel : N * F >= detail::kMinParallelWork)
  for (int64_t i = 0; i < N; ++i) {
    const float* g = inp + i * 2 * F;
    const float* u = g + F;
    float* o = out + i * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float sig = 1.0f / (1.0f + detail::exp_approx(-g[f]));
      o[f] = g[f] * sig * u[f];
    }
  }
}

void swiglu_backward(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F) {
#pragma omp parallel for schedule(static) if(parallel : N * F >= detail::kMinParallelWork)
  for (int64_t i = 0; i < N; ++i) {
    const float* g = inp + i * 2 * F;
    const float* u = g + F;
    const float* dy = dout + i * F;
    float* dg = dinp + i * 2 * F;
    float* du = dg + F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const float sig = 1.0f / (1.0f + detail::exp_approx(-g[f]));
      const float silu = g[f] * sig;
      // d silu/dg = sig * (1 + g * (1 - sig))
      dg[f] += dy[f] * u[f] * sig * (1.0f + g[f] * (1.0f - sig));
      du[f] += dy[f] * silu;
    }
  }
}

}  // namespace atl::cpu
