// AdamW's loop in 16-lane AVX-512 (adamw.cpp takes it from the avx512 path up). The scalar loop
// cannot vectorise: std::sqrt sets errno, so the compiler keeps a scalar sqrt and a branch per
// element. Here each vector step is adamw_update.h's element arithmetic, operation for operation
// (the same fmas, sqrt and division, all correctly rounded in any width), and the tail runs
// adamw_update itself: the two paths agree bit for bit (AdamW.Avx512PathEqualsTheGenericPathBitwise).
#include <cmath>  // before the target region: its inline functions stay generic

#include "kernels/cpu/adamw_paths.h"
#include "kernels/cpu/adamw_update.h"
#include "kernels/cpu/kernel_util.h"

#pragma GCC push_options
#pragma GCC target("avx512f")
#include <immintrin.h>

namespace atl::cpu {

void adamw_step_avx512(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                       float beta2, float eps, float weight_decay, float grad_scale, int64_t t) {
  const detail::AdamWCoeffs c = detail::adamw_coeffs(lr, beta1, beta2, eps, weight_decay, grad_scale, t);
  const int64_t nvec = n / 16;
#pragma omp parallel for schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t b = 0; b < nvec; ++b) {
    const int64_t i = b * 16;
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), _mm512_set1_ps(c.grad_scale));
    const __m512 mi = _mm512_fmadd_ps(_mm512_set1_ps(c.beta1), _mm512_loadu_ps(m + i),
                                      _mm512_mul_ps(_mm512_set1_ps(c.one_minus_beta1), g));
    const __m512 vi = _mm512_fmadd_ps(_mm512_set1_ps(c.beta2), _mm512_loadu_ps(v + i),
                                      _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(c.one_minus_beta2), g), g));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    // maskz_sqrt with every lane set is sqrt_ps; GCC 12 warns on sqrt_ps's undefined pass-through.
    const __m512 root = _mm512_maskz_sqrt_ps(__mmask16(0xffff), vi);
    const __m512 update = _mm512_div_ps(_mm512_mul_ps(mi, _mm512_set1_ps(c.inv_bc1)),
                                        _mm512_fmadd_ps(root, _mm512_set1_ps(c.inv_sqrt_bc2), _mm512_set1_ps(c.eps)));
    const __m512 p = _mm512_loadu_ps(param + i);
    _mm512_storeu_ps(param + i, _mm512_fmadd_ps(_mm512_set1_ps(-c.lr),
                                                _mm512_fmadd_ps(_mm512_set1_ps(c.weight_decay), p, update), p));
  }
  for (int64_t i = nvec * 16; i < n; ++i) detail::adamw_update(param[i], grad[i], m[i], v[i], c);
}

}  // namespace atl::cpu
#pragma GCC pop_options
