// cpu::adamw_step's two loops (kernels.h), callable directly so that tests cover both: the scalar
// one (adamw.cpp) and AVX-512 (adamw_avx512.cpp; the CPU must have it). adamw_step takes
// the AVX-512 one from the avx512 path up (isa.h). Both give the same bits (adamw_update.h).
#pragma once
#include <cstdint>

namespace atl::cpu {

void adamw_step_generic(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                        float beta2, float eps, float weight_decay, float grad_scale, int64_t t);
void adamw_step_avx512(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                       float beta2, float eps, float weight_decay, float grad_scale, int64_t t);

}  // namespace atl::cpu
