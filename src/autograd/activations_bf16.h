// GELU and SwiGLU as ops::gelu / ops::swiglu run them when matmul_dtype() is bf16 (precision.h):
// fp32 arithmetic, but the input saved for backward is a bf16 copy.
#pragma once
#include "autograd/graph.h"

namespace atl::ops_bf16 {

Tensor gelu(const Tensor& x);
Tensor swiglu(const Tensor& x);

}  // namespace atl::ops_bf16
