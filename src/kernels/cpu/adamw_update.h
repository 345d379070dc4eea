// One element of AdamW: the scalar loop (adamw.cpp) and the AVX-512 loop's tail run it, and the
// AVX-512 vector step (adamw_avx512.cpp) spells out the same operations. Every add sits inside an
// explicit fma, so the compiler has no product-plus-sum left to contract its own way, and sqrt and
// division are correctly rounded in every width: the paths agree bit for bit on any x86-64.
#pragma once
#include <cmath>
#include <cstdint>

namespace atl::cpu::detail {

struct AdamWCoeffs {
  float lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, grad_scale, inv_bc1, inv_sqrt_bc2;
};
AdamWCoeffs adamw_coeffs(float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                         int64_t t);

// Internal linkage: the AVX-512 file compiles its own copy, which the linker must never hand to
// generic code. (The errno std::sqrt may set keeps this scalar: no compiler vectorises it.)
[[gnu::always_inline]] static inline void adamw_update(float& param, float grad, float& m, float& v, const AdamWCoeffs& c) {
  const float g = grad * c.grad_scale;
  const float mi = std::fma(c.beta1, m, c.one_minus_beta1 * g);
  const float vi = std::fma(c.beta2, v, (c.one_minus_beta2 * g) * g);
  m = mi;
  v = vi;
  const float update = (mi * c.inv_bc1) / std::fma(std::sqrt(vi), c.inv_sqrt_bc2, c.eps);
  param = std::fma(-c.lr, std::fma(c.weight_decay, param, update), param);
}

}  // namespace atl::cpu::detail
