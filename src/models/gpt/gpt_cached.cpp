// GPT's cached inference forward: the same blocks as GPT::hidden, over only the new tokens of each
// row, with attention reading the earlier tokens' keys and values from a KVCache. Tokens are packed
// (padding dropped) so the matmuls see only real rows.
#include <algorithm>

#include "models/gpt/gpt.h"

namespace atl::nn {

KVCache GPT::make_kv_cache(int64_t batch, int64_t capacity) const {
  ATOLL_CHECK(capacity >= 1 && capacity <= c_.block_size, "kv cache capacity {} must be in [1, block_size {}]",
              capacity, c_.block_size);
  return KVCache(c_.n_layer, batch, capacity, c_.n_kv_head, c_.head_dim());
}

Tensor GPT::forward_cached(const Tensor& tokens, KVCache& cache, const std::vector<int64_t>& n_new) const {
  NoGradGuard ng;
  ATOLL_CHECK(!tp_, "forward_cached: cached inference does not run tensor-parallel; load the checkpoint (full weights) at tp = 1");
  ATOLL_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i32, "forward_cached: tokens must be [B,T] i32");
  const int64_t B = tokens.size(0), T = tokens.size(1), C = c_.n_embd, V = c_.vocab_size;
  const int64_t H = c_.n_head, KV = c_.n_kv_head, hd = c_.head_dim(), S = (H + 2 * KV) * hd;
  ATOLL_CHECK(cache.batch() == B && int64_t(n_new.size()) == B, "forward_cached: {} rows of tokens, {} counts, cache of {}",
              B, n_new.size(), cache.batch());
  ATOLL_CHECK(cache.layers() == c_.n_layer && cache.kv_heads() == KV && cache.head_dim() == hd,
              "forward_cached: the cache was not made for this model ({})", c_.describe());
  const int32_t* tok = tokens.i32();
  std::vector<CachedSpan> spans;
  int64_t N = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = n_new[size_t(b)], start = cache.length(b);
    ATOLL_CHECK(n >= 0 && n <= T, "forward_cached: row {} has {} new tokens of {}", b, n, T);
    ATOLL_CHECK(start + n <= std::min(cache.capacity(), c_.block_size),
                "forward_cached: row {} would reach position {}, beyond the cache's {} (block_size {})", b, start + n,
                cache.capacity(), c_.block_size);
    if (n == 0) continue;
    spans.push_back({b, start, n, N});
    N += n;
  }
  Tensor logits = Tensor::zeros({B, V});
  if (N == 0) return logits;

  // Embeddings at each token's own position (wte + wpe, as embedding_forward adds them).
  Tensor x = Tensor::empty({N, C});
  const float* wt = wte->weight->value.f32();
  const float* wp = wpe ? wpe->weight->value.f32() : nullptr;
  for (const CachedSpan& s : spans)
    for (int64_t t = 0; t < s.count; ++t) {
      const int32_t id = tok[s.row * T + t];
      ATOLL_CHECK(id >= 0 && id < V, "forward_cached: token id {} (row {}) is outside the vocabulary [0, {})", id,
                  s.row, V);
      float* o = x.f32() + (s.first + t) * C;
      const float* e = wt + int64_t(id) * C;
      if (wp) {
        const float* p = wp + (s.start + t) * C;
        for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
      } else {
        std::copy(e, e + C, o);
      }
    }

  Tensor att = Tensor::empty({N, H * hd});
  for (int64_t l = 0; l < c_.n_layer; ++l) {
    const Block& blk = *h[size_t(l)];
    Tensor qkv = (*blk.attn->c_attn)((*blk.ln_1)(x));
    if (c_.rope) {
      Tensor r = Tensor::empty({N, S});
      for (const CachedSpan& s : spans) {  // each row's run from its own position
        Tensor rot = ops::rope(qkv.slice(0, s.first, s.first + s.count).view({1, s.count, S}), H, KV, hd,
                               c_.rope_theta, s.start);
        std::copy(rot.f32(), rot.f32() + s.count * S, r.f32() + s.first * S);
      }
      qkv = r;
    }
    kv_cache_store(cache, l, qkv.f32(), H, spans);
    kv_cache_attention(att.f32(), qkv.f32(), cache, l, H, spans);
    Tensor r = ops::add(x, (*blk.attn->c_proj)(att));
    x = ops::add(r, (*blk.mlp)((*blk.ln_2)(r)));
  }
  std::vector<int64_t> adv(size_t(B), 0);
  for (const CachedSpan& s : spans) adv[size_t(s.row)] = s.count;
  cache.advance(adv);

  // The head only for each row's last real token.
  Tensor last = Tensor::empty({int64_t(spans.size()), C});
  for (size_t i = 0; i < spans.size(); ++i) {
    const float* src = x.f32() + (spans[i].first + spans[i].count - 1) * C;
    std::copy(src, src + C, last.f32() + int64_t(i) * C);
  }
  Tensor lg = ops::linear_t((*ln_f)(last), head_weight()->value);
  for (size_t i = 0; i < spans.size(); ++i)
    std::copy(lg.f32() + int64_t(i) * V, lg.f32() + int64_t(i + 1) * V, logits.f32() + spans[i].row * V);
  return logits;
}

}  // namespace atl::nn
