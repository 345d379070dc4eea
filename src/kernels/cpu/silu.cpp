// SiLU, x·sigmoid(x) (Elfwing et al. 2018; "Swish", Ramachandran et al. 2017), elementwise, with
// sigmoid from the vectorisable exp of kernel_util.h. d/dx = sig·(1 + x·(1 - sig)).
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"

namespace atl::cpu {

void silu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = x / (1.0f + detail::exp_approx(-x));
  }
}

void silu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float sig = 1.0f / (1.0f + detail::exp_approx(-x));
    dinp[i] += dout[i] * sig * (1.0f + x * (1.0f - sig));
  }
}

}  // namespace atl::cpu
