// GELU's bf16-mode forms (defined in gelu.cpp with the fp32 kernels; used by
// autograd/activations_bf16.cpp). Forward also writes the bf16 copy of its input that backward
// keeps (f32_to_bf16's rounding) in the same pass over the input; backward reads that copy
// (widening is exact, so these are gelu_backward's bits on the widened input) and, when
// accumulate is false, writes dinp instead of adding to it (no zeroing pass for a fresh gradient).
#pragma once
#include <cstdint>

#include "kernels/cpu/gemm.h"  // kBiasSumRows
#include "tensor/dtype.h"

namespace atl::cpu {

void gelu_forward_keep_bf16(float* out, bf16* saved, const float* inp, int64_t n);
void gelu_backward_bf16(float* dinp, const float* dout, const bf16* inp, int64_t n, bool accumulate);

// The forms that also hand their result to the next bf16 matmul (autograd/bf16_handoff.h):
// forward writes out_bf16 = f32_to_bf16(out) as well; backward (a fresh gradient of [N, OC] rows)
// writes dinp, dinp_bf16 = f32_to_bf16(dinp) and partials[ceil(N / kBiasSumRows), OC], the column
// sums of each block of dinp. Same bits as gelu_forward_keep_bf16 / gelu_backward_bf16 followed by
// the separate cast and sums.
void gelu_forward_keep_bf16(float* out, bf16* out_bf16, bf16* saved, const float* inp, int64_t n);
void gelu_backward_bf16_rows(float* dinp, bf16* dinp_bf16, float* partials, const float* dout, const bf16* inp,
                             int64_t N, int64_t OC);

}  // namespace atl::cpu
