// Activation recomputation (autograd/checkpoint.h): a checkpointed function's gradients are
// bit-identical to the recorded function's (the same kernels run in the same order on the same
// values), dropout replays its mask, nested checkpoints work, leaf hooks fire inside the
// recomputed backward, and a checkpoint keeps fewer live bytes than recording everything.
#include <gtest/gtest.h>

#include <cstring>

#include "autograd/checkpoint.h"
#include "autograd/ops.h"
#include "tensor/allocator.h"
#include "tensor/rng.h"

using namespace atl;

namespace {

Tensor param(const Shape& s, uint64_t seed, float scale = 0.3f) {
  Tensor t = Tensor::empty(s);
  Rng r(seed, 11);
  r.fill_normal(t, 0.f, scale);
  set_requires_grad(t, true, "p" + std::to_string(seed));
  return t;
}

// One layer's parameters (each layer owns its own, as a transformer block does).
struct Net {
  explicit Net(uint64_t s)
      : w1(param({16, 32}, s + 1)), b1(param({32}, s + 2)), w2(param({32, 16}, s + 3)), g(param({16}, s + 4)),
        c(param({16}, s + 5)) {}
  Tensor w1, b1, w2, g, c;
  Tensor layer(const Tensor& x, uint64_t site) const {
    Tensor h = ops::gelu(ops::linear(x, w1, b1));
    h = ops::dropout(h, 0.25f, {9, 0, 3, site});  // keyed: the recomputation draws the same mask
    return ops::add(x, ops::layernorm(ops::linear(h, w2, Tensor()), g, c));
  }
  std::vector<Tensor*> params() { return {&w1, &b1, &w2, &g, &c}; }
};

struct Nets {
  std::vector<Net> layer{Net(10), Net(20), Net(30)};
  std::vector<Tensor*> params() {
    std::vector<Tensor*> ps;
    for (Net& n : layer)
      for (Tensor* p : n.params()) ps.push_back(p);
    return ps;
  }
};

// Gradients of all parameters and the input after loss = sum(x3 * k), x3 = 3 layers of x.
std::vector<float> grads(Nets& nets, int mode) {
  for (Tensor* p : nets.params()) p->autograd()->grad = Tensor();
  Tensor x = param({4, 16}, 6, 1.f);
  Tensor k = Tensor::empty({4, 16});
  Rng(7, 1).fill_normal(k, 0.f, 1.f);
  Tensor h = x;
  for (uint64_t l = 0; l < 3; ++l) {
    Net& net = nets.layer[l];
    auto f = [&net, l](const Tensor& in) { return net.layer(in, l); };
    if (mode == 0) h = f(h);
    else if (mode == 1) h = checkpoint("test_layer", h, f);
    else  // nested: the middle layer's checkpoint inside an outer one
      h = checkpoint("outer", h, [&net, l, f](const Tensor& in) {
        return l == 1 ? checkpoint("inner", in, f) : f(in);
      });
  }
  backward(ops::dot_const(h, k));
  std::vector<float> out;
  for (Tensor* p : nets.params()) out.insert(out.end(), grad_of(*p).f32(), grad_of(*p).f32() + p->numel());
  out.insert(out.end(), grad_of(x).f32(), grad_of(x).f32() + x.numel());
  return out;
}

}  // namespace

TEST(Checkpoint, GradientsAreBitIdenticalAndDropoutReplays) {
  Nets net;
  std::vector<float> none = grads(net, 0), ck = grads(net, 1), nested = grads(net, 2);
  ASSERT_EQ(none.size(), ck.size());
  double norm = 0;
  for (float v : none) norm += double(v) * v;
  ASSERT_GT(norm, 1e-6);  // the check has something to compare
  EXPECT_EQ(std::memcmp(none.data(), ck.data(), none.size() * sizeof(float)), 0) << "checkpointed gradients differ";
  EXPECT_EQ(std::memcmp(none.data(), nested.data(), none.size() * sizeof(float)), 0) << "nested checkpoints differ";
  // A different dropout mask would change them: the comparison can fail.
  auto f = [&](const Tensor& in) { return ops::dropout(in, 0.25f, {9, 0, 4, 0}); };
  Tensor a = param({64}, 8, 1.f), b = f(a), c2 = ops::dropout(a, 0.25f, {9, 0, 3, 0});
  bool same = std::memcmp(b.f32(), c2.f32(), 64 * sizeof(float)) == 0;
  EXPECT_FALSE(same);
  clear_tape();
}

TEST(Checkpoint, LeafHooksFireInsideTheRecomputation) {
  Nets net;
  std::vector<std::string> fired;
  for (Tensor* p : net.params()) {
    std::string n = p->autograd()->name;
    add_grad_hook(*p, [&fired, n](const Tensor& g) { fired.push_back(n); });
  }
  grads(net, 1);
  // Every parameter's hook fires once, when its gradient is final, top layer first (as without
  // recomputation: DDP's buckets see the same order).
  ASSERT_EQ(fired.size(), 15u);
  EXPECT_EQ(fired.front().substr(0, 2), "p3");
  EXPECT_EQ(fired.back().substr(0, 2), "p1");
  for (Tensor* p : net.params()) clear_grad_hooks(*p);
}

TEST(Checkpoint, KeepsOnlyTheInputAlive) {
  Tensor w = param({128, 128}, 12, 0.05f);
  auto f = [&w](const Tensor& in) {
    Tensor h = in;
    for (int i = 0; i < 6; ++i) h = ops::gelu(ops::linear(h, w, Tensor()));
    return h;
  };
  auto live_after_forward = [&](bool ck) {
    Tensor x = param({64, 128}, 13, 1.f);
    Allocator& a = allocator_for(Device::cpu());
    size_t before = a.stats().current_bytes;
    Tensor y = ck ? checkpoint("test", x, f) : f(x);
    size_t held = a.stats().current_bytes - before;
    backward(ops::sum(y));
    return held;
  };
  size_t full = live_after_forward(false), kept = live_after_forward(true);
  // Recording keeps 12 activations of 64x128 floats (32 KiB each); the checkpoint only its output.
  EXPECT_GT(full, 10u * 64 * 128 * 4);
  EXPECT_LT(kept, 2u * 64 * 128 * 4);
}
