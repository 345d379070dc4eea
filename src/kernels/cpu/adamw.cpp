// AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization") over a flat buffer,
// with the gradient scale (clipping, averaging) folded in, plus the reductions clipping needs.
#include <cmath>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                float beta2, float eps, float weight_decay, float grad_scale, int64_t t) {
  // Bias corrections in double: 1 - beta2^t is tiny for small t and beta2 near 1.
  const float bc1 = float(1.0 - std::pow(double(beta1), double(t)));
  const float bc2 = float(1.0 - std::pow(double(beta2), double(t)));
  const float inv_bc1 = 1.0f / bc1, inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float update = (mi * inv_bc1) / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
    param[i] -= lr * (update + weight_decay * param[i]);
  }
}

double sum_squares(const float* x, int64_t n) {
  double acc = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : acc) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) acc += double(x[i]) * double(x[i]);
  return acc;
}

void scale_inplace(float* x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace atl::cpu
