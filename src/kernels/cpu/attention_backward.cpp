// Causal self-attention backward in the style of FlashAttention-2 (Dao 2023): probabilities are
// recomputed block by block from the saved log-sum-exp, P = exp(scale·QKᵀ - lse), and with
// D_i = dO_i·O_i the score gradient is dS = P ∘ (dO·Vᵀ - D). FlashAttention-2 accumulates dQ with
// atomics across key-block tasks; on a CPU that would serialise, so this file runs two race-free
// passes instead: one parallel over query blocks for dQ, one parallel over (kv head, key block)
// for dK and dV, which also sums the GQA query heads that share a kv head without contention.
// Both passes work on transposed score tiles (rows = keys, as in attention_forward.cpp) against
// Qᵀ and dOᵀ blocks that are packed once up front, so K, V, Q and dO are otherwise read in place.
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

#define ATOLL_ATTN_BODY "kernels/cpu/attention_backward.inc"
#include "kernels/cpu/attention_variants.h"

namespace atl::cpu {

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                        int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  if (detail::attention_avx512()) attn_avx512::causal_backward(dqkv, dout, qkv, out, lse, B, T, H, KV, hd);
  else attn_avx2::causal_backward(dqkv, dout, qkv, out, lse, B, T, H, KV, hd);
}

}  // namespace atl::cpu
