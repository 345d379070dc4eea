// The MoE layer (src/nn/moe.h) against PyTorch 1.13 (tools/moe_ref.py, float64 autograd, written
// from the layer's definition, not from atoll's code) on the same weights and tokens: the output,
// the load-balance and z losses, the chosen experts, and the gradients of
// sum(out * dy) + aux_coef * balance + z_coef * z for the input and every weight, in no-drop and
// drop modes, softmax and sigmoid routers, SwiGLU and GELU experts, with and without shared experts.
//
// Tolerance: relative L2 1e-5 against float64. atoll computes in fp32 (unit roundoff 6e-8) with
// at most C = 16 or 2F = 24 terms per GEMM sum, per-row sums of E = 6 or k, and exp/log within
// ~2 ulp (kernel_util.h): errors of order 1e-7 whatever the CPU's FMA or the BLAS path; 1e-5
// leaves 10x margin while a wrong route, weight, drop or gradient is off by > 1e-3. The routing
// itself must match exactly: the reference refuses inputs whose k-th and (k+1)-th scores are
// within 1e-5 (a near tie that rounding could flip), far above fp32 error in the scores.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>

#include "autograd/ops.h"
#include "nn/moe.h"
#include "tensor/rng.h"
#include "tensor/safetensors.h"

using namespace atl;

namespace {

constexpr double kTol = 1e-5;
constexpr int64_t B = 2, T = 9, C = 16;

struct Root : nn::Module {
  explicit Root(const nn::MoEConfig& c) : Module("") {
    layer = child<nn::MoELayer>("mlp", c);
    materialize();
  }
  nn::MoELayer* layer;
};

struct Case {
  std::string name;
  nn::MoEConfig cfg;
};

std::vector<Case> cases() {
  auto base = [] {
    nn::MoEConfig c;
    c.dim = C;
    c.n_experts = 6;
    c.top_k = 2;
    c.expert_ffn = 12;
    c.aux_loss_coef = 0.3;
    c.z_loss_coef = 0.05;
    return c;
  };
  std::vector<Case> v;
  Case a{"nodrop_softmax", base()};
  a.cfg.n_shared = 1;
  a.cfg.shared_ffn = 8;
  v.push_back(a);
  Case b{"drop_softmax_gelu", base()};
  b.cfg.drop_tokens = true;
  b.cfg.capacity_factor = 0.75;
  b.cfg.norm_topk = false;
  b.cfg.swiglu = false;
  v.push_back(b);
  Case c{"nodrop_sigmoid", base()};
  c.cfg.score = "sigmoid";
  c.cfg.top_k = 3;
  v.push_back(c);
  Case d{"drop_sigmoid_shared", base()};
  d.cfg.score = "sigmoid";
  d.cfg.drop_tokens = true;
  d.cfg.capacity_factor = 1.0;
  d.cfg.n_shared = 2;
  v.push_back(d);
  return v;
}

class MoEVsTorch : public testing::Test {
 protected:
  static inline std::map<std::string, Tensor> in;
  static inline std::map<std::string, std::string> meta;
  static inline std::unique_ptr<TensorFile> ref;
  static inline std::string error;

  static Tensor randn(const std::string& name, const Shape& s, float scale, uint64_t seed) {
    Tensor t = Tensor::empty(s);
    Rng(seed, 0).fill_normal(t, 0.f, scale);
    return in[name] = t;
  }

  static void SetUpTestSuite() {
    std::string names;
    uint64_t seed = 100;
    for (const Case& k : cases()) {
      const auto& c = k.cfg;
      const std::string& n = k.name;
      names += (names.empty() ? "" : ",") + n;
      const int64_t F = c.expert_ffn, G = c.swiglu ? 2 * F : F;
      randn(n + ".x", {B, T, C}, 1.f, seed++);
      randn(n + ".gate", {c.n_experts, C}, 0.5f, seed++);
      randn(n + ".gu", {c.n_experts, C, G}, 0.3f, seed++);
      randn(n + ".down", {c.n_experts, F, C}, 0.3f, seed++);
      if (c.n_shared > 0) {
        const int64_t Fs = c.n_shared * (c.shared_ffn > 0 ? c.shared_ffn : F);
        randn(n + ".shared_gu", {C, c.swiglu ? 2 * Fs : Fs}, 0.3f, seed++);
        randn(n + ".shared_down", {Fs, C}, 0.3f, seed++);
      }
      randn(n + ".dy", {B, T, C}, 1.f, seed++);
      meta[n + ".E"] = std::to_string(c.n_experts);
      meta[n + ".k"] = std::to_string(c.top_k);
      meta[n + ".score"] = c.score;
      meta[n + ".swiglu"] = c.swiglu ? "1" : "0";
      meta[n + ".norm_topk"] = c.norm_topk ? "1" : "0";
      meta[n + ".drop"] = c.drop_tokens ? "1" : "0";
      meta[n + ".cf"] = std::to_string(c.capacity_factor);
      meta[n + ".aux_coef"] = std::to_string(c.aux_loss_coef);
      meta[n + ".z_coef"] = std::to_string(c.z_loss_coef);
    }
    meta["cases"] = names;
    std::vector<std::pair<std::string, Tensor>> ts(in.begin(), in.end());
    const auto dir = std::filesystem::temp_directory_path() / ("atoll_moe_ref_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const auto fin = (dir / "in.safetensors").string(), fout = (dir / "out.safetensors").string();
    save_safetensors(fin, ts, meta);
    const std::string cmd = std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR + "/tools/moe_ref.py " + fin + " " + fout;
    const int rc = std::system(cmd.c_str());
    if (rc != 0)
      error = "'" + cmd + "' failed with status " + std::to_string(rc);
    else
      ref = std::make_unique<TensorFile>(load_safetensors(fout));
    std::filesystem::remove_all(dir);
  }
  static void TearDownTestSuite() {
    in.clear();
    ref.reset();
  }

  const Tensor& want(const std::string& k) {
    for (auto& [n, t] : ref->tensors)
      if (n == k) return t;
    throw std::runtime_error("reference has no " + k);
  }
  void expect_close(const Tensor& got, const std::string& key) {
    const Tensor& w = want(key);
    ASSERT_EQ(got.numel(), w.numel()) << key;
    EXPECT_LT(rel_error(got.reshape(w.shape()), w), kTol) << key;
  }

  void run_case(const Case& k) {
    ASSERT_TRUE(error.empty()) << error;
    const std::string& n = k.name;
    Root root(k.cfg);
    nn::MoELayer& L = *root.layer;
    L.gate->value.copy_from(in[n + ".gate"]);
    L.w_gate_up->value.copy_from(in[n + ".gu"]);
    L.w_down->value.copy_from(in[n + ".down"]);
    if (L.shared) {
      L.shared->gate_up_proj->weight->value.copy_from(in[n + ".shared_gu"]);
      L.shared->down_proj->weight->value.copy_from(in[n + ".shared_down"]);
    }
    Tensor x = in[n + ".x"].clone();
    set_requires_grad(x, true, "x");
    root.zero_grad();
    Tensor y = L(x);
    Tensor total = ops::add(ops::dot_const(y, in[n + ".dy"]), L.aux_loss());
    backward(total);

    // Routing first: a different choice of experts explains every later mismatch.
    const Tensor& ex = want(n + ".experts");
    {
      NoGradGuard ng;
      nn::Routing r = L.route(ops::reshape(x, {B * T, C}));
      ASSERT_EQ(int64_t(r.experts.size()), ex.numel());
      for (int64_t i = 0; i < ex.numel(); ++i) ASSERT_EQ(r.experts[size_t(i)], ex.i32()[i]) << n << " assignment " << i;
      EXPECT_EQ(r.order.numel(), int64_t(want(n + ".kept").i32()[0])) << n << ": kept assignments";
      if (k.cfg.drop_tokens) {
        EXPECT_LT(r.order.numel(), B * T * k.cfg.top_k) << n << ": the case must drop tokens";
      }
    }
    expect_close(y, n + ".y");
    EXPECT_NEAR(L.last_balance_loss(), want(n + ".balance").item(), 1e-5 * std::abs(want(n + ".balance").item())) << n;
    EXPECT_NEAR(L.last_z_loss(), want(n + ".z").item(), 1e-5 * std::abs(want(n + ".z").item())) << n;
    expect_close(grad_of(x), n + ".dx");
    expect_close(L.gate->grad, n + ".dgate");
    expect_close(L.w_gate_up->grad, n + ".dgu");
    expect_close(L.w_down->grad, n + ".ddown");
    if (L.shared) {
      expect_close(L.shared->gate_up_proj->weight->grad, n + ".dshared_gu");
      expect_close(L.shared->down_proj->weight->grad, n + ".dshared_down");
    }
  }
};

TEST_F(MoEVsTorch, NoDropSoftmaxSwiGLUWithSharedExpert) { run_case(cases()[0]); }
TEST_F(MoEVsTorch, DropSoftmaxGELU) { run_case(cases()[1]); }
TEST_F(MoEVsTorch, NoDropSigmoidTop3) { run_case(cases()[2]); }
TEST_F(MoEVsTorch, DropSigmoidWithSharedExperts) { run_case(cases()[3]); }
// The optimisation ladder's baseline (expert_gemm = "loop": one dense linear per expert) against
// the same reference and bound: its sums have the same few terms, only another kernel's order.
TEST_F(MoEVsTorch, LoopOfExpertsMatchesInEveryCase) {
  for (Case k : cases()) {
    k.cfg.expert_gemm = "loop";
    SCOPED_TRACE(k.name + " with a loop of experts");
    run_case(k);
  }
}

TEST(MoEConfig, BadLayoutsAreRefusedWithTheKey) {
  nn::MoEConfig c;
  c.dim = 8;
  c.expert_ffn = 4;
  c.n_experts = 4;
  c.top_k = 5;
  try {
    c.validate("model");
    FAIL() << "top_k above n_experts was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.top_k = 5"), std::string::npos) << e.what();
  }
  c.top_k = 2;
  c.capacity_factor = 0;
  try {
    c.validate("model");
    FAIL() << "capacity_factor 0 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.capacity_factor"), std::string::npos) << e.what();
  }
  c.capacity_factor = 1;
  EXPECT_NO_THROW(c.validate("model"));
  c.expert_gemm = "bmm";
  try {
    c.validate("model");
    FAIL() << "expert_gemm 'bmm' was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.expert_gemm"), std::string::npos) << e.what();
  }
}

// The loop of experts against the grouped GEMM directly, with experts that receive no rows (32
// experts, 12 tokens, top 2: at least 8 get none): the output and every gradient to relative L2
// 1e-5. Both compute fp32 sums
// of C = 16 or F = 8 products (OpenBLAS/oneDNN vs the grouped kernel's fixed order): rounding
// differences are ~1e-7 relative; a row sent to the wrong expert or a lost gradient is O(1).
TEST(MoELayer, LoopOfExpertsEqualsGroupedGemm) {
  nn::MoEConfig c;
  c.dim = 16, c.n_experts = 32, c.top_k = 2, c.expert_ffn = 8, c.n_shared = 1;
  nn::MoEConfig cl = c;
  cl.expert_gemm = "loop";
  Root g(c), l(cl);
  Tensor fv = g.flat_values();
  Rng(6, 0).fill_normal(fv, 0.f, 0.3f);
  Tensor lv = l.flat_values();
  lv.copy_from(fv);
  Tensor x0 = Tensor::empty({12, 16}), dy = Tensor::empty({12, 16});
  Rng(7, 0).fill_normal(x0, 0.f, 1.f);
  Rng(8, 0).fill_normal(dy, 0.f, 1.f);
  size_t nodes[2] = {0, 0};
  auto run = [&](Root& r, Tensor& gx) {
    Tensor x = x0.clone();
    set_requires_grad(x, true, "x");
    r.zero_grad();
    clear_tape();
    Tensor y = (*r.layer)(x);
    nodes[&r == &l] = tape_size();
    backward(ops::add(ops::dot_const(y, dy), r.layer->aux_loss()));
    gx = grad_of(x).clone();
    return y.clone();
  };
  Tensor gxg, gxl;
  Tensor yg = run(g, gxg), yl = run(l, gxl);
  {
    NoGradGuard ng;
    nn::Routing r = g.layer->route(x0);
    int64_t empty = 0;
    for (int64_t n : r.kept) empty += n == 0;
    ASSERT_GE(empty, 8) << "the case must leave experts without rows";
  }
  auto rel = [](const Tensor& a, const Tensor& b) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      const double d = double(a.f32()[i]) - double(b.f32()[i]);
      num += d * d;
      den += double(b.f32()[i]) * double(b.f32()[i]);
    }
    return std::sqrt(num / std::max(den, 1e-30));
  };
  EXPECT_LT(rel(yl, yg), 1e-5);
  EXPECT_LT(rel(gxl, gxg), 1e-5);
  Tensor gg = g.flat_grads(), gl = l.flat_grads();
  EXPECT_LT(rel(gl, gg), 1e-5);
  // The two may agree bit for bit (both sum each product in k order with FMA): that the loop ran
  // shows in its graph, a split, reshapes and two linears per expert with rows where grouped
  // records two grouped_linear nodes.
  EXPECT_GT(nodes[1], nodes[0] + 16) << "the loop of experts did not run";
  EXPECT_GT(max_abs_diff(g.layer->w_gate_up->grad, Tensor::zeros(g.layer->w_gate_up->grad.shape())), 0.0);
  clear_tape();
}

}  // namespace

// A forward reads nothing an earlier forward or backward wrote (micro-batches accumulate
// gradients only): the same input gives bit-identical outputs after another batch's backward.
TEST(MoELayer, ForwardIsUnaffectedByEarlierBackward) {
  nn::MoEConfig c;
  c.dim = 16, c.n_experts = 4, c.top_k = 2, c.expert_ffn = 8, c.n_shared = 1;
  Root root(c);
  Tensor fv = root.flat_values();
  Rng(3, 0).fill_normal(fv, 0.f, 0.3f);
  Tensor a = Tensor::empty({2, 5, 16}), b = Tensor::empty({2, 5, 16});
  Rng(4, 0).fill_normal(a, 0.f, 1.f);
  Rng(5, 0).fill_normal(b, 0.f, 1.f);
  Tensor first = (*root.layer)(a).clone();
  for (int i = 0; i < 2; ++i) {
    Tensor y = (*root.layer)(b);
    backward(ops::add(ops::sum(y), root.layer->aux_loss()));
  }
  Tensor again = (*root.layer)(a);
  clear_tape();
  EXPECT_EQ(max_abs_diff(first, again), 0.0);
}
