// Attention of one block of queries over one block of keys and values of the same row, the unit
// of ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers for
// Near-Infinite Context"; the blockwise online softmax of Milakov & Gimelshein 2018 and
// FlashAttention, Dao et al. 2022). The queries and the key/value block live in separate buffers
// (a rank's own qkv and a block received from a neighbour), each with its own length; the mask is
// a per-position visible range, so causal, full and document masks over global positions are all
// one kernel (kernels/dispatch.h). Forward returns the pair's normalised output and its lse, which
// the caller merges over blocks; backward takes the merged lse and D = dO·O, so that every pair's
// probabilities are the final ones, and accumulates dQ and the block's dK/dV.
//
// Row-wise and exact like attention_ranged.cpp (the same dot products and exp_approx), with its
// two race-free backward passes: dQ per query row, dK and dV per key row over its head group.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"

#define ATOLL_ATTN_BODY "kernels/cpu/attention_block.inc"
#include "kernels/cpu/attention_variants.h"

namespace atl::cpu {

void attention_block_forward(float* out, float* lse, const float* q, int64_t q_stride, const float* kv,
                             const kernels::AttentionRanges& rg, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                             int64_t KV, int64_t hd) {
  if (detail::attention_avx512()) attn_avx512::block_forward(out, lse, q, q_stride, kv, rg, B, Tq, Tk, H, KV, hd);
  else attn_avx2::block_forward(out, lse, q, q_stride, kv, rg, B, Tq, Tk, H, KV, hd);
}

void attention_block_backward(float* dq, float* dkv, const float* dout, const float* D, const float* lse,
                              const float* q, int64_t q_stride, const float* kv, const kernels::AttentionRanges& rg,
                              int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t hd) {
  if (detail::attention_avx512()) attn_avx512::block_backward(dq, dkv, dout, D, lse, q, q_stride, kv, rg, B, Tq, Tk, H, KV, hd);
  else attn_avx2::block_backward(dq, dkv, dout, D, lse, q, q_stride, kv, rg, B, Tq, Tk, H, KV, hd);
}

}  // namespace atl::cpu
