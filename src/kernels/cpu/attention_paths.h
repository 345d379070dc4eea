// The ISA variants of the CPU attention kernels (attention_variants.h compiles each kernel once
// per variant), declared for the dispatching entry points (kernels.h, op_set.h,
// attention_cached.h) and for tests that call one variant directly. attn_avx512's functions run
// AVX-512 instructions: call them only where isa_supported(Isa::avx512). Arguments as in the
// entry points of the same name without the attention_ prefix.
#pragma once
#include <cstdint>

#include "kernels/cpu/attention_cached.h"
#include "kernels/dispatch.h"

#define ATOLL_ATTN_VARIANT_DECLS                                                                                     \
  void causal_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV,        \
                      int64_t hd);                                                                                   \
  void causal_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,        \
                       int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd);                                     \
  void ranged_forward(float* out, float* lse, const float* qkv, const kernels::AttentionRanges& rg, int64_t B,      \
                      int64_t T, int64_t H, int64_t KV, int64_t hd);                                                 \
  void ranged_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,        \
                       const kernels::AttentionRanges& rg, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd); \
  void block_forward(float* out, float* lse, const float* q, int64_t q_stride, const float* kv,                     \
                     const kernels::AttentionRanges& rg, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV,   \
                     int64_t hd);                                                                                    \
  void block_backward(float* dq, float* dkv, const float* dout, const float* D, const float* lse, const float* q,   \
                      int64_t q_stride, const float* kv, const kernels::AttentionRanges& rg, int64_t B, int64_t Tq,  \
                      int64_t Tk, int64_t H, int64_t KV, int64_t hd);                                                \
  void cached_forward(float* out, const float* qkv, const CachedAttentionSpan* spans, int64_t nspans, int64_t H,    \
                      int64_t KV, int64_t hd);

namespace atl::cpu::attn_avx2 {
ATOLL_ATTN_VARIANT_DECLS
}  // namespace atl::cpu::attn_avx2

namespace atl::cpu::attn_avx512 {
ATOLL_ATTN_VARIANT_DECLS
}  // namespace atl::cpu::attn_avx512

#undef ATOLL_ATTN_VARIANT_DECLS
