// The op set beyond the GPT block against PyTorch 1.13 (tools/torch_ops_ref.py, float64 autograd)
// on the same inputs: each op's forward output and the gradients backward() gives for a random
// upstream gradient dy, through the autograd ops (so the dispatch table is on the path).
//
// Tolerance: relative L2 1e-5 against the float64 reference. atoll computes in fp32 (unit
// roundoff 6e-8) with at most a few dozen terms per accumulated sum at these sizes (bmm K = 33,
// attention rows of 37 keys, head dim 16) and exp/log within ~2 ulp (kernel_util.h), which gives
// errors of order 1e-7 to 1e-6 whatever the summation order or FMA use of the CPU or its BLAS;
// 1e-5 keeps a margin of 10x over that while any wrong formula, mask or index is off by > 1e-3.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <unistd.h>

#include "autograd/ops.h"
#include "tensor/rng.h"
#include "tensor/safetensors.h"

using namespace atl;

namespace {

constexpr double kTol = 1e-5;
constexpr int64_t AT = 37, AH = 4, AKV = 2, AHD = 16;
constexpr float kDropP = 0.3f;
const ops::DropoutKey kDropKey{11, 2, 5, 3};

class OpsVsTorch : public testing::Test {
 protected:
  static inline std::map<std::string, Tensor> in;
  static inline std::map<std::string, std::string> meta;
  static inline std::unique_ptr<TensorFile> ref;
  static inline std::string error;
  static inline uint64_t seed = 1;

  static Tensor randn(const std::string& name, const Shape& s, float scale = 1.f) {
    Tensor t = Tensor::empty(s);
    Rng(seed++, 0).fill_normal(t, 0.f, scale);
    return in[name] = t;
  }
  static Tensor ints(const std::string& name, const std::vector<int32_t>& v, const Shape& s) {
    return in[name] = Tensor::from_vector_i32(v, s);
  }
  static std::vector<int32_t> rand_ints(size_t n, int32_t hi) {
    Rng r(seed++, 0);
    std::vector<int32_t> v(n);
    for (auto& x : v) x = int32_t(r.below(uint64_t(hi)));
    return v;
  }
  static void attn_case(const std::string& c, const Tensor& doc) {
    randn(c + ".qkv", {2, AT, (AH + 2 * AKV) * AHD});
    randn(c + ".dy", {2, AT, AH * AHD});
    meta[c + ".H"] = std::to_string(AH);
    meta[c + ".KV"] = std::to_string(AKV);
    meta[c + ".hd"] = std::to_string(AHD);
    if (doc.defined()) in[c + ".doc"] = doc;
  }

  static void SetUpTestSuite() {
    randn("bmm.a", {3, 17, 33});
    randn("bmm.b", {3, 33, 9});
    randn("bmm.dy", {3, 17, 9});
    randn("softmax.x", {7, 50}, 3.f);
    randn("softmax.dy", {7, 50});
    randn("logsoftmax.x", {7, 50}, 3.f);
    randn("logsoftmax.dy", {7, 50});
    randn("silu.x", {999}, 3.f);
    randn("silu.dy", {999});
    randn("mul1.a", {4, 5, 6});
    randn("mul1.b", {6});
    randn("mul1.dy", {4, 5, 6});
    randn("mul2.a", {4, 1, 6});
    randn("mul2.b", {5, 1});
    randn("mul2.dy", {4, 5, 6});
    randn("isel.x", {3, 10, 7});
    ints("isel.idx", rand_ints(13, 10), {13});
    randn("isel.dy", {3, 13, 7});
    meta["isel.dim"] = "1";
    randn("gather.x", {4, 9});
    ints("gather.idx", rand_ints(24, 9), {4, 6});
    randn("gather.dy", {4, 6});
    meta["gather.dim"] = "1";
    randn("scatter.base", {5, 4});
    randn("scatter.src", {7, 4});
    ints("scatter.idx", rand_ints(28, 5), {7, 4});
    randn("scatter.dy", {5, 4});
    meta["scatter.dim"] = "0";
    randn("segsum.x", {20, 6});
    ints("segsum.ids", rand_ints(20, 8), {20});
    randn("segsum.dy", {8, 6});
    meta["segsum.S"] = "8";
    randn("topk.x", {6, 40});
    randn("topk.dy", {6, 5});
    meta["topk.k"] = "5";
    randn("concat.a", {3, 2, 4});
    randn("concat.b", {3, 5, 4});
    randn("concat.c", {3, 1, 4});
    randn("concat.dy", {3, 8, 4});
    meta["concat.dim"] = "1";
    randn("split.x", {3, 7, 4});
    randn("split.dy0", {3, 2, 4});
    randn("split.dy1", {3, 5, 4});
    meta["split.sizes"] = "2,5";
    meta["split.dim"] = "1";
    randn("mse.p", {8, 9});
    randn("mse.t", {8, 9});
    in["mse.dy"] = Tensor::full({1}, 0.7f);
    randn("wce.logits", {9, 31}, 3.f);
    ints("wce.targets", {3, -1, 30, 0, 7, 7, 12, 1, 29}, {9});
    in["wce.w"] = Tensor::from_vector({0.5f, 2.f, 1.f, 0.f, 3.f, 1.5f, 0.25f, 1.f, 2.f}, {9});
    ints("wce.mask", {1, 1, 1, 1, 0, 1, 1, 0, 1}, {9});
    in["wce.dy"] = Tensor::full({1}, 1.3f);
    attn_case("attn_full", Tensor());
    // Two packed rows: documents of 10, 1, 20, 6 tokens, and 37 tokens of one document.
    std::vector<int32_t> doc(2 * AT, 9);
    for (int64_t t = 0; t < AT; ++t) doc[size_t(t)] = t < 10 ? 4 : t < 11 ? 0 : t < 31 ? 4 : 2;
    attn_case("attn_doc_causal", Tensor::from_vector_i32(doc, {2, AT}));
    attn_case("attn_doc_full", Tensor::from_vector_i32(doc, {2, AT}));
    randn("dropout.x", {2000});
    randn("dropout.dy", {2000});
    {
      NoGradGuard ng;
      std::vector<float> y = ops::dropout(in["dropout.x"], kDropP, kDropKey).to_vector(), kept(y.size());
      for (size_t i = 0; i < y.size(); ++i) kept[i] = y[i] != 0.f;
      in["dropout.kept"] = Tensor::from_vector(kept, {int64_t(kept.size())});
    }
    meta["dropout.p"] = std::to_string(kDropP);

    std::vector<std::pair<std::string, Tensor>> ts(in.begin(), in.end());
    const auto dir = std::filesystem::temp_directory_path() / ("atoll_ops_ref_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const auto fin = (dir / "in.safetensors").string(), fout = (dir / "out.safetensors").string();
    save_safetensors(fin, ts, meta);
    const std::string cmd =
        std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR + "/tools/torch_ops_ref.py " + fin + " " + fout;
    const int rc = std::system(cmd.c_str());
    if (rc != 0)
      error = "'" + cmd + "' failed with status " + std::to_string(rc);
    else
      ref = std::make_unique<TensorFile>(load_safetensors(fout));
    std::filesystem::remove_all(dir);
  }

  // Tensors must die before the tensor layer's static allocator does at exit.
  static void TearDownTestSuite() {
    ref.reset();
    in.clear();
  }

  void SetUp() override { ASSERT_TRUE(ref) << "PyTorch reference unavailable: " << error; }

  static double err(const Tensor& t, const std::string& name) {
    const Tensor& r = ref->get(name);
    return rel_error(t.contiguous().reshape(r.shape()), r);
  }

  // Fresh leaves for the case's named inputs; f gives the outputs; backward of sum_k <y_k, dy_k>;
  // then every output and every input gradient against torch.
  static void expect_matches(const std::string& c, const std::vector<std::string>& names,
                             const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& f) {
    std::vector<Tensor> x;
    for (const auto& n : names) {
      x.push_back(in.at(c + "." + n).clone());
      set_requires_grad(x.back());
    }
    std::vector<Tensor> ys = f(x);
    Tensor loss;
    for (size_t k = 0; k < ys.size(); ++k) {
      const std::string dy = ys.size() == 1 ? c + ".dy" : c + ".dy" + std::to_string(k);
      Tensor l = ops::dot_const(ys[k], in.at(dy));
      loss = loss.defined() ? ops::add(loss, l) : l;
    }
    backward(loss);
    for (size_t k = 0; k < ys.size(); ++k) {
      const std::string yn = k == 0 ? c + ".y" : c + ".y" + std::to_string(k);
      EXPECT_LT(err(ys[k], yn), kTol) << yn;
    }
    for (size_t k = 0; k < names.size(); ++k) {
      ASSERT_TRUE(grad_of(x[k]).defined()) << c << ": no gradient for " << names[k];
      EXPECT_LT(err(grad_of(x[k]), c + ".d" + names[k]), kTol) << c << ".d" << names[k];
    }
  }
  using V = std::vector<Tensor>;
};

}  // namespace

TEST_F(OpsVsTorch, BatchedMatmul) {
  expect_matches("bmm", {"a", "b"}, [](const V& x) { return V{ops::bmm(x[0], x[1])}; });
}

TEST_F(OpsVsTorch, SoftmaxAndLogSoftmax) {
  expect_matches("softmax", {"x"}, [](const V& x) { return V{ops::softmax(x[0])}; });
  expect_matches("logsoftmax", {"x"}, [](const V& x) { return V{ops::log_softmax(x[0])}; });
}

TEST_F(OpsVsTorch, Silu) {
  expect_matches("silu", {"x"}, [](const V& x) { return V{ops::silu(x[0])}; });
}

TEST_F(OpsVsTorch, BroadcastMultiply) {
  expect_matches("mul1", {"a", "b"}, [](const V& x) { return V{ops::mul(x[0], x[1])}; });
  expect_matches("mul2", {"a", "b"}, [](const V& x) { return V{ops::mul(x[0], x[1])}; });
}

TEST_F(OpsVsTorch, IndexSelectGatherScatterAddSegmentSum) {
  expect_matches("isel", {"x"}, [](const V& x) { return V{ops::index_select(x[0], 1, in["isel.idx"])}; });
  expect_matches("gather", {"x"}, [](const V& x) { return V{ops::gather(x[0], 1, in["gather.idx"])}; });
  expect_matches("scatter", {"base", "src"},
                 [](const V& x) { return V{ops::scatter_add(x[0], 0, in["scatter.idx"], x[1])}; });
  expect_matches("segsum", {"x"}, [](const V& x) { return V{ops::segment_sum(x[0], in["segsum.ids"], 8)}; });
}

TEST_F(OpsVsTorch, TopK) {
  Tensor idx;
  expect_matches("topk", {"x"}, [&](const V& x) {
    ops::TopK t = ops::topk(x[0], 5);
    idx = t.indices;
    return V{t.values};
  });
  const Tensor& r = ref->get("topk.indices");
  ASSERT_EQ(r.numel(), idx.numel());
  for (int64_t i = 0; i < idx.numel(); ++i) EXPECT_EQ(idx.i32()[i], r.i32()[i]) << "index " << i;
}

TEST_F(OpsVsTorch, ConcatAndSplit) {
  expect_matches("concat", {"a", "b", "c"}, [](const V& x) { return V{ops::concat({x[0], x[1], x[2]}, 1)}; });
  expect_matches("split", {"x"}, [](const V& x) { return ops::split(x[0], {2, 5}, 1); });
}

TEST_F(OpsVsTorch, MeanSquaredError) {
  expect_matches("mse", {"p", "t"}, [](const V& x) { return V{ops::mse_loss(x[0], x[1])}; });
}

TEST_F(OpsVsTorch, CrossEntropyWithWeightsAndMask) {
  expect_matches("wce", {"logits"},
                 [](const V& x) { return V{ops::cross_entropy(x[0], in["wce.targets"], in["wce.w"], in["wce.mask"])}; });
}

TEST_F(OpsVsTorch, AttentionNonCausal) {
  expect_matches("attn_full", {"qkv"}, [](const V& x) { return V{ops::attention(x[0], AH, AKV, AHD, false, Tensor())}; });
}

TEST_F(OpsVsTorch, AttentionMaskedAtDocumentBoundaries) {
  expect_matches("attn_doc_causal", {"qkv"},
                 [](const V& x) { return V{ops::attention(x[0], AH, AKV, AHD, true, in["attn_doc_causal.doc"])}; });
  expect_matches("attn_doc_full", {"qkv"},
                 [](const V& x) { return V{ops::attention(x[0], AH, AKV, AHD, false, in["attn_doc_full.doc"])}; });
}

TEST_F(OpsVsTorch, DropoutAroundItsMask) {
  expect_matches("dropout", {"x"}, [](const V& x) { return V{ops::dropout(x[0], kDropP, kDropKey)}; });
}
