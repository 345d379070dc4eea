// Key/value cache for autoregressive decoding: each layer keeps the keys (after RoPE, when the
// model uses it) and values of every token a row has seen, so a new token costs one row through
// the model instead of the whole context (the incremental decoding of Vaswani et al. 2017's
// decoder, as in every serving stack since).
//
// Rows of a batch are independent and may hold different lengths: prompts of different lengths
// are prefilled together (right-padded, each row's real count given), and row b's next token sits
// at position length(b). Attention of a row reads only its own first length(b) slots, so nothing
// written past a row's length (padding) is ever seen.
#pragma once
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace atl::nn {

class KVCache {
 public:
  KVCache() = default;
  // layers × batch rows × capacity positions, kv_heads × head_dim per position for K and for V.
  KVCache(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim);

  int64_t layers() const { return L_; }
  int64_t batch() const { return B_; }
  int64_t capacity() const { return cap_; }
  int64_t kv_heads() const { return KV_; }
  int64_t head_dim() const { return hd_; }
  int64_t row_width() const { return KV_ * hd_; }  // floats per cached position (K or V)

  int64_t length(int64_t b) const { return len_[size_t(b)]; }
  const std::vector<int64_t>& lengths() const { return len_; }
  // Forgets row b (its slots are reused), or every row.
  void reset_row(int64_t b) { len_[size_t(b)] = 0; }
  void reset();
  // After a forward has written n[b] new positions of every layer for row b.
  void advance(const std::vector<int64_t>& n);

  // [capacity, KV*hd] of row b at layer l.
  float* k(int64_t l, int64_t b) { return kv_.f32() + slot(l, b, 0); }
  float* v(int64_t l, int64_t b) { return kv_.f32() + slot(l, b, 1); }
  const float* k(int64_t l, int64_t b) const { return kv_.f32() + slot(l, b, 0); }
  const float* v(int64_t l, int64_t b) const { return kv_.f32() + slot(l, b, 1); }

 private:
  int64_t slot(int64_t l, int64_t b, int64_t which) const { return ((l * 2 + which) * B_ + b) * cap_ * KV_ * hd_; }
  int64_t L_ = 0, B_ = 0, cap_ = 0, KV_ = 0, hd_ = 0;
  std::vector<int64_t> len_;
  Tensor kv_;  // [L, 2, B, cap, KV*hd]
};

// One packed run of new tokens: row b's tokens at positions start..start+count-1, whose q/k/v are
// rows first..first+count-1 of the packed qkv buffer.
struct CachedSpan {
  int64_t row, start, count, first;
};

// Writes the spans' keys and values (from qkv [N, (H+2KV)*hd]: q heads, k heads, v heads, as the
// attention kernel reads them) into layer l of the cache.
void kv_cache_store(KVCache& cache, int64_t layer, const float* qkv, int64_t H, const std::vector<CachedSpan>& spans);

// Causal attention of the spans' queries over the cache, which already holds their own keys
// (cpu::attention_cached_forward): out [N, H*hd].
void kv_cache_attention(float* out, const float* qkv, const KVCache& cache, int64_t layer, int64_t H,
                        const std::vector<CachedSpan>& spans);

}  // namespace atl::nn
