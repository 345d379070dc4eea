// The graph mechanics pipeline schedules need (autograd/graph.h): one tape per micro-batch in
// flight (TapeScope), backward from a non-scalar output with a given gradient, and the weight
// gradients of linear / linear_t deferred to a later pass (WeightGradDeferral) with the same
// result, bit for bit, as an unsplit backward.
#include <gtest/gtest.h>

#include "autograd/ops.h"
#include "tensor/rng.h"

using namespace atl;

namespace {

Tensor leaf(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::empty(s);
  Rng r(seed, 5);
  r.fill_normal(t, 0.f, 1.f);
  set_requires_grad(t);
  return t;
}

Tensor copy(const Tensor& t) { return t.clone(); }

bool same(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  for (int64_t i = 0; i < a.numel(); ++i)
    if (a.f32()[i] != b.f32()[i]) return false;
  return true;
}

// x -> linear(w1, b1) -> gelu -> linear_t(w2): a stage with both kinds of weight gradient.
struct Net {
  Tensor w1 = leaf({6, 10}, 1), b1 = leaf({10}, 2), w2 = leaf({5, 10}, 3);
  Tensor operator()(const Tensor& x) const { return ops::linear_t(ops::gelu(ops::linear(x, w1, b1)), w2); }
  void zero() {
    for (Tensor* t : {&w1, &b1, &w2})
      if (grad_of(*t).defined()) grad_buffer(*t).zero();
  }
};

}  // namespace

TEST(TapeScope, BackwardFromAGivenGradientMatchesTheScalarLoss) {
  Net net;
  Tensor x = leaf({4, 6}, 7), c = leaf({4, 5}, 8);
  // sum(out * c) has d/d out = c: seeding out with c must give the same gradients.
  backward(ops::sum(ops::dot_const(net(x), c)));
  Tensor gx = copy(grad_of(x)), gw = copy(grad_of(net.w1));
  grad_buffer(x).zero();
  net.zero();
  Tensor out = net(x);
  backward(out, c);
  EXPECT_TRUE(same(grad_of(x), gx));
  EXPECT_TRUE(same(grad_of(net.w1), gw));
  EXPECT_THROW(backward(out, Tensor::zeros({3, 5})), Error);  // a gradient of the wrong shape
}

TEST(TapeScope, EachMicroBatchKeepsItsOwnGraphUntilItsBackward) {
  Net net;
  Tensor x0 = leaf({4, 6}, 11), x1 = leaf({4, 6}, 12), g = leaf({4, 5}, 13);
  // Reference: one micro-batch after the other on the thread's tape.
  backward(net(x0), g);
  backward(net(x1), g);
  Tensor ref = copy(grad_of(net.w1)), ref_x0 = copy(grad_of(x0));
  net.zero();
  grad_buffer(x0).zero();
  grad_buffer(x1).zero();
  // Both forwards first (1F1B's warm-up), each on its own tape; then the backwards in order.
  Tape t0, t1;
  Tensor y0, y1;
  {
    TapeScope s(t0);
    y0 = net(x0);
  }
  {
    TapeScope s(t1);
    y1 = net(x1);
  }
  EXPECT_EQ(tape_size(), 0u) << "the thread's own tape recorded nothing";
  EXPECT_GT(t0.nodes.size(), 0u);
  EXPECT_EQ(t0.nodes.size(), t1.nodes.size());
  {
    TapeScope s(t0);
    backward(y0, g);
  }
  EXPECT_TRUE(t0.nodes.empty());
  EXPECT_FALSE(t1.nodes.empty()) << "the other micro-batch's graph is untouched";
  {
    TapeScope s(t1);
    backward(y1, g);
  }
  EXPECT_TRUE(same(grad_of(net.w1), ref));
  EXPECT_TRUE(same(grad_of(x0), ref_x0));
}

TEST(WeightGradDeferral, SplitBackwardEqualsTheFusedOneBitForBit) {
  Net net;
  Tensor x = leaf({4, 6}, 21), g = leaf({4, 5}, 22);
  backward(net(x), g);
  Tensor rx = copy(grad_of(x)), rw1 = copy(grad_of(net.w1)), rb1 = copy(grad_of(net.b1)), rw2 = copy(grad_of(net.w2));
  net.zero();
  grad_buffer(x).zero();
  Tensor y = net(x);
  std::vector<std::function<void()>> w;
  {
    WeightGradDeferral d;
    backward(y, g);
    w = d.take();
  }
  // B: the input gradient is complete, the weights' are not computed yet.
  EXPECT_TRUE(same(grad_of(x), rx));
  EXPECT_EQ(w.size(), 2u) << "one deferred pass per linear / linear_t";
  for (const Tensor* t : {&net.w1, &net.b1, &net.w2}) {
    Tensor gt = grad_of(*t);
    for (int64_t i = 0; gt.defined() && i < gt.numel(); ++i) ASSERT_EQ(gt.f32()[i], 0.f);
  }
  // W, later.
  for (auto& f : w) f();
  EXPECT_TRUE(same(grad_of(net.w1), rw1));
  EXPECT_TRUE(same(grad_of(net.b1), rb1));
  EXPECT_TRUE(same(grad_of(net.w2), rw2));
}
