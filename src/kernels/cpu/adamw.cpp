// AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization") over a flat buffer,
// with the gradient scale (clipping, averaging) folded in, plus the reductions clipping needs. The
// update runs in 16-lane AVX-512 from the avx512 path up (adamw_avx512.cpp), scalar below (std::sqrt's
// errno keeps the compiler from vectorising it): AdamW was 3.7% of a bf16 step at d384.
#include <cmath>

#include "kernels/cpu/adamw_paths.h"
#include "kernels/cpu/adamw_update.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

namespace detail {
AdamWCoeffs adamw_coeffs(float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                         int64_t t) {
  // Bias corrections in double: 1 - beta2^t is tiny for small t and beta2 near 1.
  const float bc1 = float(1.0 - std::pow(double(beta1), double(t)));
  const float bc2 = float(1.0 - std::pow(double(beta2), double(t)));
  return {lr, beta1, 1.0f - beta1, beta2, 1.0f - beta2, eps, weight_decay, grad_scale, 1.0f / bc1, 1.0f / std::sqrt(bc2)};
}
}  // namespace detail

void adamw_step_generic(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                        float beta2, float eps, float weight_decay, float grad_scale, int64_t t) {
  const detail::AdamWCoeffs c = detail::adamw_coeffs(lr, beta1, beta2, eps, weight_decay, grad_scale, t);
#pragma omp parallel for schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) detail::adamw_update(param[i], grad[i], m[i], v[i], c);
}

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                float eps, float weight_decay, float grad_scale, int64_t t) {
  // The path is the run-time ISA's (isa.h), so ATOLL_ISA=avx2 also selects the generic loop.
  auto step = active_isa() >= Isa::avx512 ? adamw_step_avx512 : adamw_step_generic;
  step(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
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
