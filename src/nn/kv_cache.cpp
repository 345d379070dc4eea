#include "nn/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/attention_cached.h"

namespace atl::nn {

KVCache::KVCache(int64_t layers, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim)
    : L_(layers), B_(batch), cap_(capacity), KV_(kv_heads), hd_(head_dim), len_(size_t(batch), 0) {
  ATOLL_CHECK(layers > 0 && batch > 0 && capacity > 0 && kv_heads > 0 && head_dim > 0,
              "kv cache: sizes must be positive (layers {}, batch {}, capacity {}, kv heads {}, head dim {})", layers,
              batch, capacity, kv_heads, head_dim);
  kv_ = Tensor::empty({layers, 2, batch, capacity, kv_heads * head_dim});
}

void KVCache::reset() { std::fill(len_.begin(), len_.end(), 0); }

void KVCache::advance(const std::vector<int64_t>& n) {
  ATOLL_CHECK(int64_t(n.size()) == B_, "kv cache: {} counts for {} rows", n.size(), B_);
  for (int64_t b = 0; b < B_; ++b) {
    ATOLL_CHECK(len_[size_t(b)] + n[size_t(b)] <= cap_, "kv cache: row {} would hold {} positions, capacity {}", b,
                len_[size_t(b)] + n[size_t(b)], cap_);
    len_[size_t(b)] += n[size_t(b)];
  }
}

void kv_cache_store(KVCache& cache, int64_t layer, const float* qkv, int64_t H, const std::vector<CachedSpan>& sp) {
  const int64_t W = cache.row_width(), hd = cache.head_dim(), S = H * hd + 2 * W;
  for (const CachedSpan& s : sp) {
    ATOLL_CHECK(s.start + s.count <= cache.capacity(), "kv cache: positions up to {} exceed the capacity {}",
                s.start + s.count, cache.capacity());
    float* k = cache.k(layer, s.row);
    float* v = cache.v(layer, s.row);
    for (int64_t t = 0; t < s.count; ++t) {
      const float* src = qkv + (s.first + t) * S;
      std::memcpy(k + (s.start + t) * W, src + H * hd, size_t(W) * sizeof(float));
      std::memcpy(v + (s.start + t) * W, src + H * hd + W, size_t(W) * sizeof(float));
    }
  }
}

void kv_cache_attention(float* out, const float* qkv, const KVCache& cache, int64_t layer, int64_t H,
                        const std::vector<CachedSpan>& spans) {
  std::vector<cpu::CachedAttentionSpan> ks;
  for (const CachedSpan& s : spans) ks.push_back({cache.k(layer, s.row), cache.v(layer, s.row), s.start, s.count, s.first});
  cpu::attention_cached_forward(out, qkv, ks.data(), int64_t(ks.size()), H, cache.kv_heads(), cache.head_dim());
}

}  // namespace atl::nn
