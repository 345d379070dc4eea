#include "nn/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/kernel_util.h"

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

// The operations and their order follow attention_forward.cpp (scores q·k summed over the head
// dim in order, then scaled; keys in blocks of 64 with the online softmax's rescaling; output
// accumulated in key order, divided by the sum at the end), so that a cached query's result
// matches the training kernel's for the same inputs up to the rounding of the inputs themselves.
void kv_cache_attention(float* out, const float* qkv, const KVCache& cache, int64_t layer, int64_t H,
                        const std::vector<CachedSpan>& spans) {
  using cpu::detail::exp_approx;
  constexpr int64_t BL = 64;
  const int64_t KV = cache.kv_heads(), hd = cache.head_dim(), W = cache.row_width();
  const int64_t S = H * hd + 2 * W, rep = H / KV;
  const float scale = 1.0f / std::sqrt(float(hd));
  ATOLL_CHECK(H % KV == 0, "kv cache attention: {} query heads are not a multiple of {} kv heads", H, KV);

  // One task per (token, head): decoding has few tokens, prefill many; either way enough tasks.
  std::vector<std::pair<const CachedSpan*, int64_t>> tok;  // (span, t)
  for (const CachedSpan& s : spans)
    for (int64_t t = 0; t < s.count; ++t) tok.emplace_back(&s, t);
  const int64_t ntask = int64_t(tok.size()) * H;
  int64_t work = 0;
  for (const CachedSpan& s : spans) work += s.count * (s.start + s.count) * H * hd;

#pragma omp parallel if(parallel : work >= cpu::detail::kMinParallelWork)
  {
    std::vector<float> sc(BL), o(static_cast<size_t>(hd));
#pragma omp for schedule(dynamic, 4)
    for (int64_t task = 0; task < ntask; ++task) {
      const CachedSpan& s = *tok[size_t(task / H)].first;
      const int64_t t = tok[size_t(task / H)].second, h = task % H, g = h / rep;
      const int64_t p = s.start + t;  // this query's position; it sees keys 0..p
      const float* q = qkv + (s.first + t) * S + h * hd;
      const float* K = cache.k(layer, s.row) + g * hd;
      const float* V = cache.v(layer, s.row) + g * hd;
      float m = -INFINITY, l = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t j0 = 0; j0 <= p; j0 += BL) {
        const int64_t nk = std::min(BL, p + 1 - j0);
        float mblk = -INFINITY;
        for (int64_t j = 0; j < nk; ++j) {
          const float* k = K + (j0 + j) * W;
          float acc = 0.0f;
          for (int64_t d = 0; d < hd; ++d) acc += q[d] * k[d];
          sc[size_t(j)] = acc * scale;
          mblk = std::max(mblk, sc[size_t(j)]);
        }
        const float mnew = std::max(m, mblk);
        const float alpha = exp_approx(m - mnew);
        m = mnew;
        l *= alpha;
        for (int64_t j = 0; j < nk; ++j) {
          const float e = exp_approx(sc[size_t(j)] - m);
          sc[size_t(j)] = e;
          l += e;
        }
        for (int64_t e = 0; e < hd; ++e) o[size_t(e)] *= alpha;
        for (int64_t j = 0; j < nk; ++j) {
          const float pj = sc[size_t(j)];
          const float* v = V + (j0 + j) * W;
#pragma omp simd
          for (int64_t e = 0; e < hd; ++e) o[size_t(e)] += pj * v[e];
        }
      }
      const float inv = 1.0f / l;
      float* dst = out + (s.first + t) * H * hd + h * hd;
      for (int64_t e = 0; e < hd; ++e) dst[e] = o[size_t(e)] * inv;
    }
  }
}

}  // namespace atl::nn
