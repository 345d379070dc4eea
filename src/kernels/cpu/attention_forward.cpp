// Causal self-attention forward, blocked with an online softmax (FlashAttention: Dao et al. 2022;
// the loop order of FlashAttention-2, Dao 2023: each task owns one query block of one head and
// walks the key blocks up to the diagonal), so the T×T score matrix is never stored. Grouped-query
// attention (Ainslie et al. 2023): query head h reads kv head h / (H/KV). Saves the row
// log-sum-exp for the backward pass.
//
// CPU layout choice: the task packs its query block transposed once and computes scores
// transposed, Sᵀ = K·Qᵀ, so K and V are read in place (no per-block packing) and the softmax
// statistics of the 64 queries are updated as vectors across a row of Sᵀ.
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

#define ATOLL_ATTN_BODY "kernels/cpu/attention_forward.inc"
#include "kernels/cpu/attention_variants.h"

namespace atl::cpu {

void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t hd) {
  if (detail::attention_avx512()) attn_avx512::causal_forward(out, lse, qkv, B, T, H, KV, hd);
  else attn_avx2::causal_forward(out, lse, qkv, B, T, H, KV, hd);
}

}  // namespace atl::cpu
