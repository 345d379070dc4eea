// GELU's bf16-mode forms (defined in gelu.cpp with the fp32 kernels; used by
// autograd/activations_bf16.cpp). Forward also writes the bf16 copy of its input that backward
// keeps (f32_to_bf16's rounding) in the same pass over the input; backward reads that copy
// (widening is exact, so these are gelu_backward's bits on the widened input) and, when
// accumulate is false, writes dinp instead of adding to it (no zeroing pass for a fresh gradient).
#pragma once
#include <cstdint>

#include "tensor/dtype.h"

namespace atl::cpu {

void gelu_forward_keep_bf16(float* out, bf16* saved, const float* inp, int64_t n);
void gelu_backward_bf16(float* dinp, const float* dout, const bf16* inp, int64_t n, bool accumulate);

}  // namespace atl::cpu
