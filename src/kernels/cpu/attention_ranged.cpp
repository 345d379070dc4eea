// Self-attention with a per-position visible key range, for attention that is not causal (an
// encoder, a diffusion transformer) or that is masked at document boundaries when variable-length
// sequences are packed into one row (each token sees only its own document: the block-diagonal
// mask of packed training, as in FlashAttention's varlen interface, Dao 2023). Query t sees keys
// [k_lo[t], k_hi[t]) and key j is seen by queries [q_lo[j], q_hi[j]) (kernels/dispatch.h), which
// covers causal, full and document masks alike. Grouped-query heads as in attention_forward.cpp;
// the lse it saves has the same [B,H,T] layout.
//
// This is the row-wise formulation (a score row per query, exact softmax, probabilities recomputed
// in backward from the lse): simple and exact, not blocked like the causal kernel, so it is for
// these masks, not for the GPT hot path. Backward runs two race-free passes as the causal kernel
// does: dQ per query row, then dK and dV per key row summing the heads of its group.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"

#define ATOLL_ATTN_BODY "kernels/cpu/attention_ranged.inc"
#include "kernels/cpu/attention_variants.h"

namespace atl::cpu {

void attention_ranged_forward(float* out, float* lse, const float* qkv, const kernels::AttentionRanges& rg, int64_t B,
                              int64_t T, int64_t H, int64_t KV, int64_t hd) {
  if (detail::attention_avx512()) attn_avx512::ranged_forward(out, lse, qkv, rg, B, T, H, KV, hd);
  else attn_avx2::ranged_forward(out, lse, qkv, rg, B, T, H, KV, hd);
}

void attention_ranged_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                               const kernels::AttentionRanges& rg, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t hd) {
  if (detail::attention_avx512()) attn_avx512::ranged_backward(dqkv, dout, qkv, out, lse, rg, B, T, H, KV, hd);
  else attn_avx2::ranged_backward(dqkv, dout, qkv, out, lse, rg, B, T, H, KV, hd);
}

}  // namespace atl::cpu
