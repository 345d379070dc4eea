// Causal attention as ops::attention runs it when matmul_dtype() is bf16 and the CPU multiplies
// bf16 natively (kernels/cpu/attention_bf16.h): bf16 products with fp32 softmax and accumulation.
// The node keeps q, k and v once, as one head-major bf16 copy, instead of the fp32 qkv and output.
#pragma once
#include "autograd/graph.h"

namespace atl::ops_bf16 {

// Whether attention(qkv, H, KV, hd) takes this path here and now (else the fp32 kernels).
bool attention_applies(const Tensor& qkv, int64_t H, int64_t KV);
Tensor attention(const Tensor& qkv, int64_t H, int64_t hd);

}  // namespace atl::ops_bf16
