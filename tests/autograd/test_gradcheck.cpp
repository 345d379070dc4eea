// Every differentiable op against central finite differences (autograd/gradcheck.h), plus the
// graph mechanics: accumulation across backward calls, no-grad scope, and the gradient-ready hook.
#include <gtest/gtest.h>

#include <memory>
#include <string>

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

constexpr double kTol = 2e-2;  // fp32 central differences with eps 1e-2

}  // namespace

TEST(GradCheck, Linear) {
  auto r = gradcheck([](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); },
                     {leaf({3, 5, 7}, 1), leaf({7, 6}, 2), leaf({6}, 3)});
  EXPECT_LT(r.max_rel_error, kTol) << "input " << r.worst_input;
}

TEST(GradCheck, LinearTransposed) {
  auto r = gradcheck([](const std::vector<Tensor>& in) { return ops::linear_t(in[0], in[1]); },
                     {leaf({4, 7}, 1), leaf({9, 7}, 2)});
  EXPECT_LT(r.max_rel_error, kTol) << "input " << r.worst_input;
}

TEST(GradCheck, Embedding) {
  Tensor tok = Tensor::from_vector_i32({1, 4, 4, 0, 2, 1}, {2, 3});
  auto r = gradcheck([&](const std::vector<Tensor>& in) { return ops::embedding(tok, in[0], in[1]); },
                     {leaf({5, 4}, 1), leaf({3, 4}, 2)});
  EXPECT_LT(r.max_rel_error, kTol) << "input " << r.worst_input;
}

TEST(GradCheck, LayerNorm) {
  auto r = gradcheck([](const std::vector<Tensor>& in) { return ops::layernorm(in[0], in[1], in[2]); },
                     {leaf({6, 10}, 1), leaf({10}, 2), leaf({10}, 3)});
  EXPECT_LT(r.max_rel_error, kTol) << "input " << r.worst_input;
}

TEST(GradCheck, RmsNorm) {
  auto r = gradcheck([](const std::vector<Tensor>& in) { return ops::rmsnorm(in[0], in[1]); },
                     {leaf({6, 10}, 1), leaf({10}, 2)});
  EXPECT_LT(r.max_rel_error, kTol) << "input " << r.worst_input;
}

TEST(GradCheck, Gelu) {
  auto r = gradcheck([](const std::vector<Tensor>& in) { return ops::gelu(in[0]); }, {leaf({5, 9}, 1, 2.f)});
  EXPECT_LT(r.max_rel_error, kTol);
}

TEST(GradCheck, SwiGlu) {
  auto r = gradcheck([](const std::vector<Tensor>& in) { return ops::swiglu(in[0]); }, {leaf({5, 12}, 1, 2.f)});
  EXPECT_LT(r.max_rel_error, kTol);
}

TEST(GradCheck, Add) {
  auto r = gradcheck([](const std::vector<Tensor>& in) { return ops::add(in[0], in[1]); },
                     {leaf({4, 6}, 1), leaf({4, 6}, 2)});
  EXPECT_LT(r.max_rel_error, kTol);
}

TEST(GradCheck, Rope) {
  // H=2 query heads, KV=1, hd=8 -> width (2+2)*8.
  auto r = gradcheck([](const std::vector<Tensor>& in) { return ops::rope(in[0], 2, 1, 8, 10000.f, 3); },
                     {leaf({2, 5, 32}, 1)});
  EXPECT_LT(r.max_rel_error, kTol);
}

TEST(GradCheck, AttentionGroupedQuery) {
  // H=4, KV=2, hd=4, T=7 (not a multiple of any block size).
  auto r = gradcheck([](const std::vector<Tensor>& in) { return ops::attention(in[0], 4, 2, 4); },
                     {leaf({2, 7, 32}, 1)}, 1e-2f, 128);
  EXPECT_LT(r.max_rel_error, kTol);
}

TEST(GradCheck, CrossEntropyWithIgnoredTargets) {
  Tensor tg = Tensor::from_vector_i32({3, -1, 0, 5, 2, -1}, {6});
  auto r = gradcheck([&](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], tg); }, {leaf({6, 7}, 1)});
  EXPECT_LT(r.max_rel_error, kTol);
}

TEST(GradCheck, CatchesAWrongGradient) {
  // A deliberately wrong backward (scaled by 2) must fail the check: the check can fail.
  auto bad = [](const std::vector<Tensor>& in) {
    Tensor out = in[0].clone();
    if (should_record({&in[0]})) {
      record("bad", out, {in[0]}, [](Node& n) {
        const float* g = grad_of(n.output).f32();
        float* d = grad_buffer(n.inputs[0]).f32();
        for (int64_t i = 0; i < n.inputs[0].numel(); ++i) d[i] += 2.f * g[i];
      });
    }
    return out;
  };
  EXPECT_GT(gradcheck(bad, {leaf({3, 3}, 1)}).max_rel_error, 0.5);
}

TEST(Graph, GradientsAccumulateAcrossBackwardCalls) {
  Tensor w = leaf({4, 3}, 1), x = Tensor::full({2, 4}, 1.f);
  backward(ops::sum(ops::linear(x, w, Tensor())));
  std::vector<float> once = grad_of(w).to_vector();
  backward(ops::sum(ops::linear(x, w, Tensor())));
  std::vector<float> twice = grad_of(w).to_vector();
  for (size_t i = 0; i < once.size(); ++i) EXPECT_FLOAT_EQ(twice[i], 2 * once[i]);
}

TEST(Graph, NoGradScopeRecordsNothing) {
  Tensor w = leaf({4, 3}, 1), x = Tensor::full({2, 4}, 1.f);
  {
    NoGradGuard ng;
    Tensor y = ops::linear(x, w, Tensor());
    EXPECT_FALSE(requires_grad(y));
  }
  EXPECT_EQ(tape_size(), 0u);
}

TEST(Graph, HookFiresOnceGradientIsFinal) {
  // w is used twice; its hook must fire after both contributions, with the summed gradient.
  Tensor w = leaf({3}, 1), x1 = Tensor::full({2, 3}, 1.f), x2 = Tensor::full({2, 3}, 2.f);
  Tensor wm = leaf({3, 3}, 2);
  int fired = 0;
  float seen = 0;
  add_grad_hook(w, [&](const Tensor& g) {
    ++fired;
    seen = g.f32()[0];
  });
  Tensor a = ops::layernorm(x1, w, Tensor());
  Tensor b = ops::layernorm(ops::linear(x2, wm, Tensor()), w, Tensor());
  backward(ops::sum(ops::add(a, b)));
  EXPECT_EQ(fired, 1);
  EXPECT_FLOAT_EQ(seen, grad_of(w).f32()[0]);
}

TEST(Graph, HooksSharingANodeFireInInputOrder) {
  // DDP issues collectives from these hooks, so the order must not depend on where the leaves'
  // records happen to live in memory: leaves first used by one node fire in its input order.
  for (int rep = 0; rep < 8; ++rep) {
    std::vector<std::shared_ptr<int>> noise;  // shifts the heap between repetitions
    for (int i = 0; i < rep * 7; ++i) noise.push_back(std::make_shared<int>(i));
    Tensor x = leaf({2, 4}, 1), w = leaf({4, 3}, 2), b = leaf({3}, 3);
    std::vector<char> order;
    add_grad_hook(x, [&](const Tensor&) { order.push_back('x'); });
    add_grad_hook(w, [&](const Tensor&) { order.push_back('w'); });
    add_grad_hook(b, [&](const Tensor&) { order.push_back('b'); });
    backward(ops::sum(ops::linear(x, w, b)));
    EXPECT_EQ(std::string(order.begin(), order.end()), "xwb") << "repetition " << rep;
  }
}
