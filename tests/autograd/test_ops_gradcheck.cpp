// The op set beyond the GPT block against central finite differences (autograd/gradcheck.h), and
// the behaviour each op promises beyond its gradient: masks, ties, determinism, errors.
#include <gtest/gtest.h>

#include <numeric>

#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "tensor/rng.h"

using namespace atl;

namespace {

Tensor leaf(const Shape& s, uint64_t seed, float scale = 1.f) {
  Tensor t = Tensor::empty(s);
  Rng r(seed, 3);
  r.fill_normal(t, 0.f, scale);
  set_requires_grad(t);
  return t;
}

Tensor ids(const std::vector<int32_t>& v, const Shape& s) { return Tensor::from_vector_i32(v, s); }

// Same bound as test_gradcheck.cpp: fp32 central differences with eps 1e-2 carry O(eps^2)
// truncation and ~1e-7/eps rounding, a few 1e-3 relative on these sizes; 2e-2 leaves room for
// any CPU's rounding while a wrong gradient (GradCheck.CatchesAWrongGradient) is off by O(1).
constexpr double kTol = 2e-2;

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

double check(const Fn& f, std::vector<Tensor> in, int max_elems = 64) {
  return gradcheck(f, std::move(in), 1e-2f, max_elems).max_rel_error;
}

}  // namespace

TEST(OpsGradCheck, BatchedMatmul) {
  EXPECT_LT(check([](auto& in) { return ops::bmm(in[0], in[1]); }, {leaf({3, 4, 5}, 1), leaf({3, 5, 6}, 2)}), kTol);
}

TEST(OpsGradCheck, SoftmaxAndLogSoftmax) {
  EXPECT_LT(check([](auto& in) { return ops::softmax(in[0]); }, {leaf({4, 9}, 1, 2.f)}), kTol);
  EXPECT_LT(check([](auto& in) { return ops::log_softmax(in[0]); }, {leaf({4, 9}, 2, 2.f)}), kTol);
}

TEST(OpsGradCheck, Silu) {
  EXPECT_LT(check([](auto& in) { return ops::silu(in[0]); }, {leaf({5, 7}, 1, 3.f)}), kTol);
}

TEST(OpsGradCheck, BroadcastMultiply) {
  // Row vector, column, scalar-like and middle-dim broadcasts, and both operands broadcast.
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 4, 5}, {5}}, {{3, 4, 5}, {4, 1}}, {{1}, {2, 3}}, {{3, 1, 5}, {1, 4, 5}}, {{2, 3}, {2, 3}}};
  for (size_t c = 0; c < cases.size(); ++c) {
    auto [sa, sb] = cases[c];
    EXPECT_LT(check([](auto& in) { return ops::mul(in[0], in[1]); }, {leaf(sa, 1 + c), leaf(sb, 11 + c)}), kTol)
        << shape_str(sa) << " * " << shape_str(sb);
  }
}

TEST(OpsGradCheck, BroadcastMultiplyRejectsIncompatibleShapes) {
  EXPECT_THROW(ops::mul(leaf({3, 4}, 1), leaf({3}, 2)), Error);
}

TEST(OpsGradCheck, IndexSelectWithRepeats) {
  Tensor idx = ids({2, 0, 2, 3, 2}, {5});
  EXPECT_LT(check([&](auto& in) { return ops::index_select(in[0], 0, idx); }, {leaf({4, 6}, 1)}), kTol);
  EXPECT_LT(check([&](auto& in) { return ops::index_select(in[0], -2, idx); }, {leaf({2, 4, 3}, 2)}), kTol);
}

TEST(OpsGradCheck, GatherAndScatterAdd) {
  Tensor idx = ids({0, 2, 2, 1, 1, 1, 3, 0}, {2, 4});
  EXPECT_LT(check([&](auto& in) { return ops::gather(in[0], 1, idx); }, {leaf({2, 5}, 1)}), kTol);
  Tensor idx0 = ids({0, 2, 1, 2, 0, 0}, {2, 3});
  EXPECT_LT(check([&](auto& in) { return ops::scatter_add(in[0], 0, idx0, in[1]); }, {leaf({3, 3}, 2), leaf({2, 3}, 3)}),
            kTol);
}

TEST(OpsGradCheck, SegmentSumUnsorted) {
  Tensor seg = ids({1, 0, 1, 3, 1, 0}, {6});  // segment 2 is empty
  EXPECT_LT(check([&](auto& in) { return ops::segment_sum(in[0], seg, 4); }, {leaf({6, 5}, 1)}), kTol);
  Tensor out = ops::segment_sum(Tensor::full({6, 2}, 1.f), seg, 4);
  EXPECT_EQ(out.to_vector(), (std::vector<float>{2, 2, 3, 3, 0, 0, 1, 1}));
}

TEST(OpsGradCheck, IndexOpsRejectOutOfRangeIndices) {
  EXPECT_THROW(ops::index_select(leaf({4, 2}, 1), 0, ids({4}, {1})), Error);
  EXPECT_THROW(ops::segment_sum(leaf({2, 2}, 1), ids({0, -1}, {2}), 3), Error);
  EXPECT_THROW(ops::gather(leaf({2, 2}, 1), 1, ids({0, 2, 0, 0}, {2, 2})), Error);
}

TEST(OpsGradCheck, TopKThroughValues) {
  // Distinct values with gaps far above the difference step, so the selection is stable under it.
  std::vector<float> v(3 * 8);
  std::iota(v.begin(), v.end(), 0.f);
  Rng r(5, 0);
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[r.below(i)]);
  for (auto& x : v) x *= 0.1f;
  Tensor x = Tensor::from_vector(v, {3, 8});
  set_requires_grad(x);
  EXPECT_LT(check([](auto& in) { return ops::topk(in[0], 3).values; }, {x}), kTol);
}

TEST(OpsGradCheck, TopKOrdersDescendingAndBreaksTiesByIndex) {
  ops::TopK t = ops::topk(Tensor::from_vector({1, 5, 3, 5, -2}, {1, 5}), 3);
  EXPECT_EQ(t.values.to_vector(), (std::vector<float>{5, 5, 3}));
  std::vector<int32_t> ix(t.indices.i32(), t.indices.i32() + 3);
  EXPECT_EQ(ix, (std::vector<int32_t>{1, 3, 2}));
}

TEST(OpsGradCheck, ConcatAndSplit) {
  EXPECT_LT(check([](auto& in) { return ops::concat({in[0], in[1], in[2]}, 1); },
                  {leaf({2, 3, 4}, 1), leaf({2, 1, 4}, 2), leaf({2, 2, 4}, 3)}),
            kTol);
  // Split, then use the pieces unevenly (one twice, one not at all) so each piece's gradient counts.
  EXPECT_LT(check([](auto& in) {
              auto p = ops::split(in[0], {2, 3, 1}, -1);
              return ops::concat({p[2], p[0], p[0]}, -1);
            },
                  {leaf({3, 6}, 4)}),
            kTol);
  Tensor a = Tensor::from_vector({1, 2, 3, 4}, {2, 2});
  Tensor b = Tensor::from_vector({5, 6}, {2, 1});
  EXPECT_EQ(ops::concat({a, b}, 1).to_vector(), (std::vector<float>{1, 2, 5, 3, 4, 6}));
  EXPECT_THROW(ops::split(a, {1, 2}, 0), Error);
}

TEST(OpsGradCheck, MeanSquaredErrorBothSides) {
  EXPECT_LT(check([](auto& in) { return ops::mse_loss(in[0], in[1]); }, {leaf({4, 5}, 1), leaf({4, 5}, 2)}), kTol);
}

TEST(OpsGradCheck, CrossEntropyWeightedAndMasked) {
  Tensor tg = ids({3, -1, 0, 5, 2, 6}, {6});
  Tensor w = Tensor::from_vector({0.5f, 2.f, 1.f, 0.f, 3.f, 1.5f}, {6});
  Tensor mask = ids({1, 1, 0, 1, 1, 1}, {6});
  EXPECT_LT(check([&](auto& in) { return ops::cross_entropy(in[0], tg, w, mask); }, {leaf({6, 7}, 1)}), kTol);
  // Without weights or mask it is the plain mean over kept targets.
  Tensor x = leaf({6, 7}, 2);
  EXPECT_FLOAT_EQ(ops::cross_entropy(x, tg, Tensor(), Tensor()).item(), ops::cross_entropy(x, tg).item());
}

TEST(OpsGradCheck, AttentionNonCausalGroupedQuery) {
  EXPECT_LT(check([](auto& in) { return ops::attention(in[0], 4, 2, 4, false, Tensor()); }, {leaf({2, 7, 32}, 1)}, 128),
            kTol);
}

TEST(OpsGradCheck, AttentionMaskedAtDocumentBoundaries) {
  Tensor doc = ids({0, 0, 0, 1, 1, 2, 2, 2, 7, 7, 7, 7, 7, 3}, {2, 7});
  for (bool causal : {true, false})
    EXPECT_LT(check([&](auto& in) { return ops::attention(in[0], 2, 1, 4, causal, doc); }, {leaf({2, 7, 16}, 2)}, 128),
              kTol)
        << "causal " << causal;
}

TEST(OpsGradCheck, PackedDocumentsMatchSeparateRows) {
  // One packed row of documents [3, 5, 2] must give what each document gives alone.
  const int64_t H = 2, KV = 1, hd = 8, W = (H + 2 * KV) * hd;
  Tensor qkv = leaf({1, 10, W}, 3);
  Tensor doc = ops::doc_ids_from_cu_seqlens({0, 3, 8, 10});
  for (bool causal : {true, false}) {
    Tensor packed = ops::attention(qkv, H, KV, hd, causal, doc);
    int64_t s = 0;
    for (int64_t len : {3, 5, 2}) {
      Tensor part = qkv.slice(1, s, s + len).contiguous();
      Tensor alone = causal ? ops::attention(part, H, KV, hd) : ops::attention(part, H, KV, hd, false, Tensor());
      EXPECT_LT(rel_error(packed.slice(1, s, s + len).contiguous(), alone), 1e-6) << "causal " << causal << " at " << s;
      s += len;
    }
  }
  clear_tape();
}

TEST(OpsGradCheck, DropoutIsDeterministicPerSeedRankAndStep) {
  Tensor x = Tensor::full({1 << 16}, 1.f);
  const float p = 0.25f;
  auto mask = [&](ops::DropoutKey k) { return ops::dropout(x, p, k).to_vector(); };
  std::vector<float> a = mask({7, 0, 3, 1});
  EXPECT_EQ(a, mask({7, 0, 3, 1}));  // same key: same mask
  for (ops::DropoutKey other : {ops::DropoutKey{8, 0, 3, 1}, ops::DropoutKey{7, 1, 3, 1}, ops::DropoutKey{7, 0, 4, 1},
                                ops::DropoutKey{7, 0, 3, 2}})
    EXPECT_NE(a, mask(other));
  // Kept elements carry 1/(1-p); the kept fraction is within 5 standard deviations of 1-p.
  int64_t kept = 0;
  for (float v : a) {
    ASSERT_TRUE(v == 0.f || std::abs(v - 1.f / (1.f - p)) < 1e-6f) << v;
    kept += v != 0.f;
  }
  const double n = double(a.size()), sd = std::sqrt(n * p * (1 - p));
  EXPECT_NEAR(double(kept), n * (1 - p), 5 * sd);
  EXPECT_LT(check([](auto& in) { return ops::dropout(in[0], 0.3f, {1, 2, 3, 4}); }, {leaf({6, 9}, 1)}), kTol);
  EXPECT_THROW(ops::dropout(x, 1.f, {}), Error);
}
