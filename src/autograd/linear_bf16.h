// bf16 matmul forms used by ops::linear / ops::linear_t when matmul_dtype() is bf16.
#pragma once
#include "autograd/graph.h"
#include "autograd/precision.h"

namespace atl::ops_bf16 {

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, int64_t N, int64_t C, int64_t OC, Shape out_shape);
Tensor linear_t(const Tensor& x, const Tensor& w, int64_t N, int64_t C, int64_t OC, Shape out_shape);

}  // namespace atl::ops_bf16
