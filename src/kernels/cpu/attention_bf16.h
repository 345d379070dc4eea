// Causal self-attention with bf16 products on the matrix engine (bf16 mixed precision): QKᵀ and PV
// and the four backward products run as batched bf16 GEMMs with fp32 accumulation (oneDNN's
// batched matmul on AMX tiles, the AVX-512 BF16 kernel per head elsewhere), while the softmax, the
// log-sum-exp and every sum stay fp32. Multi-head only (H query heads, H kv heads); grouped-query
// attention keeps the fp32 kernels.
//
// Layout: `packed` holds q, k and v head-major, [3][B·H][T][hd] bf16, made once from the fp32 qkv
// [B,T,3·H·hd] by attention_bf16_pack; forward and backward read only it (and lse), so the graph
// keeps half the bytes of the fp32 qkv and no copy of the output.
#pragma once
#include <cstdint>
#include <string>

#include "tensor/dtype.h"

namespace atl::cpu {

// The active path multiplies bf16 natively (avx512_bf16 or amx); otherwise why_not says why.
bool attention_bf16_supported(std::string* why_not = nullptr);

void attention_bf16_pack(bf16* packed, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t hd);

// out [B,T,H·hd] fp32; lse [B,H,T] (the rows' log-sum-exp of the scaled scores, for backward).
// out_bf16, if given, also gets f32_to_bf16(out) (the output projection's input, handed over by
// autograd/bf16_handoff.h), written while each head's rows are in cache.
void attention_bf16_forward(float* out, float* lse, const bf16* packed, int64_t B, int64_t T, int64_t H, int64_t hd,
                            bf16* out_bf16 = nullptr);

// dqkv [B,T,3·H·hd] += the gradient for dout [B,T,H·hd] (= when accumulate is false).
void attention_bf16_backward(float* dqkv, const float* dout, const bf16* packed, const float* lse, int64_t B,
                             int64_t T, int64_t H, int64_t hd, bool accumulate = true);

}  // namespace atl::cpu
