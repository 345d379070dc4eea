// Layer norm as ops::layernorm runs it when matmul_dtype() is bf16 (precision.h): fp32 arithmetic
// and output, but what backward needs of the input is kept as the normalised x̂ in bf16.
#pragma once
#include "autograd/graph.h"

namespace atl::ops_bf16 {

Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps);

}  // namespace atl::ops_bf16
