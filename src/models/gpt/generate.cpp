#include "models/gpt/generate.h"

#include <algorithm>

namespace atl::nn {

namespace {

struct Row {
  std::vector<int32_t> seq;  // prompt + generated
  int64_t start = 0;         // the context is seq[start..]
  bool done = false;
  Generation out;
  int64_t context() const { return int64_t(seq.size()) - start; }
};

// Logits of each listed row's whole context, one full forward per row (the head only at the last
// position: the reference should not be slowed by work it does not need).
void recompute(const GPT& m, std::vector<Row>& rows, const std::vector<int64_t>& which, Tensor& logits) {
  const int64_t V = m.config().vocab_size, C = m.config().n_embd;
  for (int64_t b : which) {
    Row& r = rows[size_t(b)];
    std::vector<int32_t> ctx(r.seq.begin() + r.start, r.seq.end());
    const int64_t T = int64_t(ctx.size());
    Tensor hid = m.hidden(Tensor::from_vector_i32(ctx, {1, T}));
    Tensor lg = ops::linear_t(hid.view({T, C}).slice(0, T - 1, T), m.head_weight()->value);
    std::copy(lg.f32(), lg.f32() + V, logits.f32() + b * V);
  }
}

// Feeds the listed rows' tokens from position cache.length(b) of their context on (right-padded
// into one [B, T] call) and copies their logits into `logits`.
void feed(const GPT& m, KVCache& cache, std::vector<Row>& rows, const std::vector<int64_t>& which, Tensor& logits) {
  if (which.empty()) return;
  const int64_t B = int64_t(rows.size()), V = m.config().vocab_size;
  std::vector<int64_t> n(size_t(B), 0);
  int64_t T = 0;
  for (int64_t b : which) T = std::max(T, n[size_t(b)] = rows[size_t(b)].context() - cache.length(b));
  Tensor tok = Tensor::zeros({B, T}, DType::i32);
  for (int64_t b : which) {
    const Row& r = rows[size_t(b)];
    const int32_t* src = r.seq.data() + r.start + cache.length(b);
    std::copy(src, src + n[size_t(b)], tok.i32() + b * T);
  }
  Tensor lg = m.forward_cached(tok, cache, n);
  for (int64_t b : which) std::copy(lg.f32() + b * V, lg.f32() + (b + 1) * V, logits.f32() + b * V);
}

}  // namespace

std::vector<Generation> generate(const GPT& m, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& o) {
  NoGradGuard ng;
  o.sampling.validate();
  ATOLL_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be 0 or more, got {}", o.max_new_tokens);
  ATOLL_CHECK(!prompts.empty(), "generate: no prompts");
  const GPTConfig& c = m.config();
  const int64_t B = int64_t(prompts.size()), V = c.vocab_size, block = c.block_size;
  const int64_t keep = std::max<int64_t>(1, block / 2);
  std::vector<Row> rows(static_cast<size_t>(B));
  std::vector<Rng> rng;
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b) {
    Row& r = rows[size_t(b)];
    r.seq = prompts[size_t(b)];
    ATOLL_CHECK(!r.seq.empty(), "generate: prompt {} is empty (start it with a token such as end-of-text)", b);
    r.start = std::max<int64_t>(0, r.context() - block);
    longest = std::max(longest, int64_t(r.seq.size()) + o.max_new_tokens);
    rng.emplace_back(o.sampling.seed, uint64_t(b));
  }
  if (o.max_new_tokens == 0) {
    std::vector<Generation> none(static_cast<size_t>(B));
    return none;
  }
  KVCache cache;
  if (o.use_cache) cache = m.make_kv_cache(B, std::min(block, longest));

  std::vector<int64_t> all(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) all[size_t(b)] = b;
  Tensor logits = Tensor::zeros({B, V});
  if (o.use_cache) feed(m, cache, rows, all, logits);
  else recompute(m, rows, all, logits);

  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    if (o.on_logits) o.on_logits(step, logits);
    std::vector<int64_t> shifted, decode;
    for (int64_t b = 0; b < B; ++b) {
      Row& r = rows[size_t(b)];
      if (r.done) continue;
      const int32_t t = sample_token(logits.f32() + b * V, V, o.sampling, rng[size_t(b)]);
      if (o.sampling.is_stop(t)) {
        r.done = r.out.stopped = true;
        continue;
      }
      r.seq.push_back(t);
      r.out.tokens.push_back(t);
      if (step + 1 == o.max_new_tokens) continue;
      if (r.context() > block) {
        r.start = int64_t(r.seq.size()) - keep;
        if (o.use_cache) cache.reset_row(b);
        shifted.push_back(b);
      } else {
        decode.push_back(b);
      }
    }
    if (step + 1 == o.max_new_tokens || (shifted.empty() && decode.empty())) break;
    if (o.use_cache) {
      feed(m, cache, rows, shifted, logits);  // re-read the kept context
      feed(m, cache, rows, decode, logits);   // one new token each
    } else {
      decode.insert(decode.end(), shifted.begin(), shifted.end());
      recompute(m, rows, decode, logits);
    }
  }
  std::vector<Generation> out;
  for (Row& r : rows) out.push_back(std::move(r.out));
  return out;
}

}  // namespace atl::nn
