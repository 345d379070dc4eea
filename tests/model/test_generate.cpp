// Cached generation (nn/kv_cache, GPT::forward_cached, nn/generate) against full recomputation,
// and the sampler's settings. GPT-2-style (learned positions, MHA) and Llama-style (RoPE, GQA with
// 2 kv heads for 4 query heads) tiny presets.
//
// Why token identity is a fair requirement: both paths see the same contexts; the cached path's
// logits differ from the recomputed ones only by fp32 summation order (a matmul over 1 row instead
// of T rows; attention follows the training kernel's order), a few 1e-7 relative. A greedy pick
// changes only if the two best logits are that close, and a sampled pick only if the uniform draw
// falls that close to a boundary of the cumulative distribution; the checks below also bound the
// logit difference directly, so a genuine error (a wrong position, a stale key) fails loudly there
// rather than showing up as a rare token flip.
#include <gtest/gtest.h>

#include <cmath>

#include "core/threads.h"
#include "models/gpt/generate.h"

using namespace atl;

namespace {

// Logit bound: the logits are O(1) and the paths differ by reassociation across a few layers.
constexpr float kLogitTol = 2e-4f;

std::unique_ptr<nn::GPT> tiny(const char* preset) {
  auto m = std::make_unique<nn::GPT>(nn::GPTConfig::preset(preset));
  m->init_weights(7);
  // Larger embeddings than GPT-2's 0.02 make the tiny model's next-token distribution peaked, as a
  // trained model's is, instead of nearly uniform (so greedy picks are not near-ties).
  auto scale = [](Tensor& w, float s) {
    for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] *= s;
  };
  scale(m->wte->weight->value, 10.0f);
  // And sharper attention: at GPT-2's init the scores are near 0 and attention is nearly uniform,
  // which would hide a key at the wrong position or a wrong rotation.
  for (nn::Block* b : m->h) scale(b->attn->c_attn->weight->value, 5.0f);
  return m;
}

std::vector<std::vector<int32_t>> prompts(int64_t V) {
  Rng r(5, 0);
  std::vector<std::vector<int32_t>> p;
  for (int64_t len : {1, 7, 30}) {
    std::vector<int32_t> x;
    for (int64_t i = 0; i < len; ++i) x.push_back(int32_t(r.below(uint64_t(V))));
    p.push_back(x);
  }
  return p;
}

// Runs both paths and checks tokens and the per-step logits.
void check_same(const nn::GPT& m, const std::vector<std::vector<int32_t>>& p, nn::GenerateOptions o) {
  std::vector<Tensor> lc, lr;
  o.use_cache = true;
  o.on_logits = [&](int64_t, const Tensor& l) { lc.push_back(l.clone()); };
  auto cached = nn::generate(m, p, o);
  o.use_cache = false;
  o.on_logits = [&](int64_t, const Tensor& l) { lr.push_back(l.clone()); };
  auto full = nn::generate(m, p, o);
  ASSERT_EQ(cached.size(), p.size());
  ASSERT_EQ(full.size(), p.size());
  for (size_t b = 0; b < p.size(); ++b) {
    EXPECT_EQ(cached[b].tokens, full[b].tokens) << "row " << b << " (prompt length " << p[b].size() << ")";
    EXPECT_EQ(cached[b].stopped, full[b].stopped) << "row " << b;
  }
  ASSERT_EQ(lc.size(), lr.size());
  const int64_t V = m.config().vocab_size;
  float worst = 0;
  for (size_t s = 0; s < lc.size(); ++s)
    for (size_t b = 0; b < p.size(); ++b) {
      // A row that finished keeps stale logits in both paths; compare rows still generating (a row
      // that picked its stop token at step s had live logits at s).
      if (int64_t(cached[b].tokens.size()) < int64_t(s)) continue;
      for (int64_t v = 0; v < V; ++v)
        worst = std::max(worst, std::fabs(lc[s].f32()[int64_t(b) * V + v] - lr[s].f32()[int64_t(b) * V + v]));
    }
  EXPECT_LT(worst, kLogitTol) << "largest logit difference between cached and recomputed";
  std::printf("largest logit difference cached vs recomputed: %.3g\n", double(worst));
}

// One thread: these models are so small that OpenMP barriers, not arithmetic, dominate a forward
// (on a loaded 2-core machine a 100-token recomputation took 15 s with two threads, 0.2 s with one).
class Generate : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    saved_ = num_threads();
    set_num_threads(1);
  }
  void TearDown() override { set_num_threads(saved_); }
  int saved_ = 0;
};

TEST_P(Generate, PrefillLogitsMatchFullForward) {
  auto m = tiny(GetParam());
  auto p = prompts(m->config().vocab_size);
  nn::KVCache cache = m->make_kv_cache(int64_t(p.size()), m->config().block_size);
  const int64_t T = 30, V = m->config().vocab_size;
  Tensor tok = Tensor::zeros({int64_t(p.size()), T}, DType::i32);
  std::vector<int64_t> n;
  for (size_t b = 0; b < p.size(); ++b) {
    std::copy(p[b].begin(), p[b].end(), tok.i32() + int64_t(b) * T);
    n.push_back(int64_t(p[b].size()));
  }
  Tensor lg = m->forward_cached(tok, cache, n);
  for (size_t b = 0; b < p.size(); ++b) {
    EXPECT_EQ(cache.length(int64_t(b)), n[b]);
    Tensor ref = m->logits(Tensor::from_vector_i32(p[b], {1, n[b]}));
    const float* last = ref.f32() + (n[b] - 1) * V;
    for (int64_t v = 0; v < V; ++v)
      ASSERT_NEAR(lg.f32()[int64_t(b) * V + v], last[v], kLogitTol) << "row " << b << " token " << v;
  }
}

TEST_P(Generate, ChunkedPrefillMatchesOneCall) {
  // Positions offset by what the cache holds: 30 tokens as 12 + 18 equal one call of 30.
  auto m = tiny(GetParam());
  auto p = prompts(m->config().vocab_size)[2];
  const int64_t V = m->config().vocab_size;
  nn::KVCache one = m->make_kv_cache(1, 64), two = m->make_kv_cache(1, 64);
  Tensor a = m->forward_cached(Tensor::from_vector_i32(p, {1, 30}), one, {30});
  std::vector<int32_t> p1(p.begin(), p.begin() + 12), p2(p.begin() + 12, p.end());
  m->forward_cached(Tensor::from_vector_i32(p1, {1, 12}), two, {12});
  Tensor b = m->forward_cached(Tensor::from_vector_i32(p2, {1, 18}), two, {18});
  EXPECT_EQ(two.length(0), 30);
  for (int64_t v = 0; v < V; ++v) ASSERT_NEAR(a.f32()[v], b.f32()[v], kLogitTol) << v;
}

TEST_P(Generate, GreedyCachedEqualsRecompute) {
  auto m = tiny(GetParam());
  nn::GenerateOptions o;
  o.max_new_tokens = 100;  // past block_size 64: the context shift is exercised too
  o.sampling.temperature = 0;
  check_same(*m, prompts(m->config().vocab_size), o);
}

TEST_P(Generate, SampledCachedEqualsRecompute) {
  auto m = tiny(GetParam());
  nn::GenerateOptions o;
  o.max_new_tokens = 100;
  o.sampling.temperature = 0.9f;
  o.sampling.top_k = 40;
  o.sampling.top_p = 0.95f;
  o.sampling.seed = 1234;
  check_same(*m, prompts(m->config().vocab_size), o);
}

TEST_P(Generate, RowsDoNotDependOnTheirBatch) {
  auto m = tiny(GetParam());
  auto p = prompts(m->config().vocab_size);
  nn::GenerateOptions o;
  o.max_new_tokens = 40;
  o.sampling.temperature = 1.0f;
  o.sampling.seed = 77;
  auto batch = nn::generate(*m, p, o);
  for (size_t b = 0; b < p.size(); ++b) {
    // Alone, row b must use its batch stream: place it at index b behind copies of row 0.
    std::vector<std::vector<int32_t>> solo(b + 1, p[0]);
    solo[b] = p[b];
    EXPECT_EQ(nn::generate(*m, solo, o)[b].tokens, batch[b].tokens) << "row " << b;
  }
}

TEST_P(Generate, StopTokenEndsOnlyItsRow) {
  auto m = tiny(GetParam());
  auto p = prompts(m->config().vocab_size);
  nn::GenerateOptions o;
  o.max_new_tokens = 30;
  o.sampling.temperature = 0;
  auto free_run = nn::generate(*m, p, o);
  const int32_t stop = free_run[1].tokens[5];
  o.sampling.stop_tokens = {stop};
  auto stopped = nn::generate(*m, p, o);
  for (size_t b = 0; b < p.size(); ++b) {
    auto& f = free_run[b].tokens;
    auto at = std::find(f.begin(), f.end(), stop);
    std::vector<int32_t> want(f.begin(), at);
    EXPECT_EQ(stopped[b].tokens, want) << "row " << b;
    EXPECT_EQ(stopped[b].stopped, at != f.end()) << "row " << b;
  }
  EXPECT_TRUE(stopped[1].stopped);
  EXPECT_LE(stopped[1].tokens.size(), 5u);
  check_same(*m, p, o);
}

INSTANTIATE_TEST_SUITE_P(Presets, Generate, ::testing::Values("gpt2-tiny", "llama-tiny"));

TEST(Sampling, TopKOneAndTinyTopPAreGreedy) {
  std::vector<float> lg = {0.1f, 2.0f, -1.0f, 1.9f, 0.5f};
  nn::SamplingConfig g;
  g.temperature = 0;
  Rng r(1, 0);
  EXPECT_EQ(nn::sample_token(lg.data(), 5, g, r), 1);
  nn::SamplingConfig k1;
  k1.top_k = 1;
  nn::SamplingConfig p0;
  p0.top_p = 1e-6f;
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(nn::sample_token(lg.data(), 5, k1, r), 1);
    EXPECT_EQ(nn::sample_token(lg.data(), 5, p0, r), 1);
  }
}

TEST(Sampling, TopKAndTopPRestrictTheDraws) {
  // softmax of {2, 1.9, 0.5, 0.1, -1}: 0.430, 0.389, 0.096, 0.064, 0.021 (ids 1, 3, 4, 0, 2).
  std::vector<float> lg = {0.1f, 2.0f, -1.0f, 1.9f, 0.5f};
  nn::SamplingConfig k2;
  k2.top_k = 2;
  nn::SamplingConfig p85;
  p85.top_p = 0.85f;  // needs ids 1, 3 and 4 (0.819 < 0.85 <= 0.914)
  nn::SamplingConfig all;
  Rng r(3, 0);
  std::vector<int> seen_k(5), seen_p(5), seen_all(5);
  for (int i = 0; i < 4000; ++i) {
    ++seen_k[size_t(nn::sample_token(lg.data(), 5, k2, r))];
    ++seen_p[size_t(nn::sample_token(lg.data(), 5, p85, r))];
    ++seen_all[size_t(nn::sample_token(lg.data(), 5, all, r))];
  }
  EXPECT_EQ(seen_k[0] + seen_k[2] + seen_k[4], 0);
  EXPECT_GT(seen_k[1], 1500);
  EXPECT_GT(seen_k[3], 1500);
  EXPECT_EQ(seen_p[0] + seen_p[2], 0);
  EXPECT_GT(seen_p[4], 200);  // 0.096 / 0.914 of 4000 is about 420
  // The whole distribution: each id about p * 4000 (bounds of 5 standard deviations, sqrt(4000 p (1-p))).
  const double p_all[5] = {0.0643, 0.4297, 0.0214, 0.3888, 0.0959};
  for (int v = 0; v < 5; ++v)
    EXPECT_NEAR(seen_all[size_t(v)], 4000 * p_all[v], 5 * std::sqrt(4000 * p_all[v] * (1 - p_all[v]))) << v;
}

TEST(Sampling, BadSettingsAreRefusedNamingThem) {
  auto refused = [](nn::SamplingConfig s, const std::string& what) {
    try {
      s.validate("--");
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << what;
  };
  nn::SamplingConfig s;
  s.temperature = -1;
  refused(s, "--temperature");
  s = {};
  s.temperature = NAN;
  refused(s, "--temperature");
  s = {};
  s.top_k = -3;
  refused(s, "--top-k");
  s = {};
  s.top_p = 0;
  refused(s, "--top-p");
  s = {};
  s.top_p = 1.5f;
  refused(s, "--top-p");
  nn::SamplingConfig ok;
  ok.temperature = 0;
  ok.top_p = 1.0f;
  EXPECT_NO_THROW(ok.validate("--"));
}

}  // namespace
