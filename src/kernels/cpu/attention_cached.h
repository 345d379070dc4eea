// Causal attention of a few new queries over keys and values kept from earlier steps (a KV
// cache, nn/kv_cache.h): the decoding counterpart of attention_forward, inference only.
#pragma once
#include <cstdint>

namespace atl::cpu {

// One row's run of new queries: positions start..start+count-1, stored as rows first.. of the
// packed qkv buffer; that row's keys and values for positions 0..start+count-1 are rows of k and
// v, each [positions, KV*hd] (the new queries' own keys included).
struct CachedAttentionSpan {
  const float* k;
  const float* v;
  int64_t start, count, first;
};

// out [N, H*hd] for the spans' queries, read from qkv [N, (H+2KV)*hd] (q heads first). Query
// head h reads kv head h / (H/KV) (grouped-query attention).
void attention_cached_forward(float* out, const float* qkv, const CachedAttentionSpan* spans, int64_t nspans,
                              int64_t H, int64_t KV, int64_t hd);

}  // namespace atl::cpu
