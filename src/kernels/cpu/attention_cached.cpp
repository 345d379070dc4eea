// The operations and their order follow attention_forward.cpp (FlashAttention's online softmax,
// Dao et al. 2022): scores q·k summed over the head dim in order, then scaled; keys in blocks of
// 64 with the running maximum's rescaling; the output accumulated in key order and divided by the
// sum at the end. A cached query's result thus matches the training kernel's on the same inputs
// up to the rounding of those inputs, which keeps cached and recomputed generation in step.
#include "kernels/cpu/attention_cached.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"

#define ATOLL_ATTN_BODY "kernels/cpu/attention_cached.inc"
#include "kernels/cpu/attention_variants.h"

namespace atl::cpu {

void attention_cached_forward(float* out, const float* qkv, const CachedAttentionSpan* spans, int64_t nspans,
                              int64_t H, int64_t KV, int64_t hd) {
  if (detail::attention_avx512()) attn_avx512::cached_forward(out, qkv, spans, nspans, H, KV, hd);
  else attn_avx2::cached_forward(out, qkv, spans, nspans, H, KV, hd);
}

}  // namespace atl::cpu
