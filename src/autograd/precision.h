// Matmul precision for mixed-precision training: with bf16, linear layers and the LM head
// multiply bf16 copies of activations and weights with fp32 accumulation (AVX-512 BF16 where the
// CPU has it), while master weights, gradients, norms, attention and the optimizer stay fp32.
#pragma once
#include "tensor/dtype.h"

namespace atl {

void set_matmul_dtype(DType dt);  // f32 (default) or bf16
DType matmul_dtype();

}  // namespace atl
