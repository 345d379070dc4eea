// The fused kernels against PyTorch (tools/torch_kernel_ref.py, float64 autograd): inputs go to a
// safetensors file, one Python run computes every reference, and each kernel's forward outputs
// and input gradients must agree to 1e-5 relative L2.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>

#include "kernel_test_util.h"
#include "kernels/cpu/kernels.h"
#include "tensor/safetensors.h"

using namespace atl;
using namespace atl::test;

namespace {

constexpr int64_t LN_N = 6, LN_C = 77;
constexpr int64_t GELU_N = 999;
constexpr int64_t RB = 2, RT = 9, RH = 4, RKV = 2, RHD = 12, ROFF = 5;
constexpr float RTHETA = 10000.0f;
constexpr int64_t AB = 2, AT = 75, AH = 4, AKV = 2, AHD = 32;
constexpr int64_t CE_N = 5, CE_V = 503;

Tensor vec(const std::vector<float>& v, const Shape& s) { return Tensor::from_vector(v, s); }

class TorchReference : public testing::Test {
 protected:
  static inline std::map<std::string, std::vector<float>> in;
  static inline std::vector<int32_t> targets;
  static inline std::unique_ptr<TensorFile> ref;
  static inline std::string error;

  static void SetUpTestSuite() {
    in["ln.x"] = randn(LN_N * LN_C, 1, 2.0f);
    in["ln.w"] = randn(LN_C, 2);
    in["ln.b"] = randn(LN_C, 3);
    in["ln.dy"] = randn(LN_N * LN_C, 4);
    in["gelu.x"] = randn(GELU_N, 5, 3.0f);
    in["gelu.dy"] = randn(GELU_N, 6);
    const int64_t RS = (RH + 2 * RKV) * RHD;
    in["rope.x"] = randn(RB * RT * RS, 7);
    in["rope.dy"] = randn(RB * RT * RS, 8);
    const int64_t AS = (AH + 2 * AKV) * AHD;
    in["attn.qkv"] = randn(AB * AT * AS, 9);
    in["attn.dy"] = randn(AB * AT * AH * AHD, 10);
    in["ce.logits"] = randn(CE_N * CE_V, 11, 3.0f);
    in["ce.dl"] = randn(CE_N, 12);
    targets = {3, -1, 502, 0, 250};

    std::vector<std::pair<std::string, Tensor>> ts = {
        {"ln.x", vec(in["ln.x"], {LN_N, LN_C})},         {"ln.w", vec(in["ln.w"], {LN_C})},
        {"ln.b", vec(in["ln.b"], {LN_C})},               {"ln.dy", vec(in["ln.dy"], {LN_N, LN_C})},
        {"gelu.x", vec(in["gelu.x"], {GELU_N})},         {"gelu.dy", vec(in["gelu.dy"], {GELU_N})},
        {"rope.x", vec(in["rope.x"], {RB, RT, RS})},     {"rope.dy", vec(in["rope.dy"], {RB, RT, RS})},
        {"attn.qkv", vec(in["attn.qkv"], {AB, AT, AS})}, {"attn.dy", vec(in["attn.dy"], {AB, AT, AH * AHD})},
        {"ce.logits", vec(in["ce.logits"], {CE_N, CE_V})}, {"ce.dl", vec(in["ce.dl"], {CE_N})},
        {"ce.targets", Tensor::from_vector_i32(targets, {CE_N})}};
    std::map<std::string, std::string> meta = {
        {"ln.eps", "1e-5"},   {"rope.B", std::to_string(RB)},   {"rope.T", std::to_string(RT)},
        {"rope.H", std::to_string(RH)}, {"rope.KV", std::to_string(RKV)}, {"rope.hd", std::to_string(RHD)},
        {"rope.theta", "10000"}, {"rope.offset", std::to_string(ROFF)}, {"attn.B", std::to_string(AB)},
        {"attn.T", std::to_string(AT)}, {"attn.H", std::to_string(AH)}, {"attn.KV", std::to_string(AKV)},
        {"attn.hd", std::to_string(AHD)}};
    const auto dir = std::filesystem::temp_directory_path() / ("atoll_kernel_ref_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const auto fin = (dir / "in.safetensors").string(), fout = (dir / "out.safetensors").string();
    save_safetensors(fin, ts, meta);
    const std::string cmd = std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR + "/tools/torch_kernel_ref.py " + fin +
                            " " + fout;
    const int rc = std::system(cmd.c_str());
    if (rc != 0) {
      error = "'" + cmd + "' failed with status " + std::to_string(rc);
    } else {
      ref = std::make_unique<TensorFile>(load_safetensors(fout));
    }
    std::filesystem::remove_all(dir);
  }

  // Tensors must die before the tensor layer's static allocator does at exit.
  static void TearDownTestSuite() { ref.reset(); }

  void SetUp() override { ASSERT_TRUE(ref) << "PyTorch reference unavailable: " << error; }

  // rel_error against the reference tensor `name`, reshaped like it.
  static double err(const std::vector<float>& v, const std::string& name) {
    const Tensor& r = ref->get(name);
    return rel_error(Tensor::from_vector(v, r.shape()), r);
  }
};

constexpr double kTol = 1e-5;

}  // namespace

TEST_F(TorchReference, LayerNorm) {
  std::vector<float> y(LN_N * LN_C), mean(LN_N), rstd(LN_N), dx(LN_N * LN_C, 0.0f), dw(LN_C, 0.0f), db(LN_C, 0.0f);
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), in["ln.x"].data(), in["ln.w"].data(), in["ln.b"].data(),
                         LN_N, LN_C, 1e-5f);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), in["ln.dy"].data(), in["ln.x"].data(), in["ln.w"].data(),
                          mean.data(), rstd.data(), LN_N, LN_C);
  EXPECT_LT(err(y, "ln.y"), kTol);
  EXPECT_LT(err(dx, "ln.dx"), kTol);
  EXPECT_LT(err(dw, "ln.dw"), kTol);
  EXPECT_LT(err(db, "ln.db"), kTol);
}

TEST_F(TorchReference, GeluTanh) {
  std::vector<float> y(GELU_N), dx(GELU_N, 0.0f);
  cpu::gelu_forward(y.data(), in["gelu.x"].data(), GELU_N);
  cpu::gelu_backward(dx.data(), in["gelu.dy"].data(), in["gelu.x"].data(), GELU_N);
  EXPECT_LT(err(y, "gelu.y"), kTol);
  EXPECT_LT(err(dx, "gelu.dx"), kTol);
}

TEST_F(TorchReference, RopeRotateHalf) {
  const size_t n = in["rope.x"].size();
  std::vector<float> y(n), dx(n, 0.0f);
  cpu::rope_forward(y.data(), in["rope.x"].data(), RB, RT, RH, RKV, RHD, RTHETA, ROFF);
  cpu::rope_backward(dx.data(), in["rope.dy"].data(), RB, RT, RH, RKV, RHD, RTHETA, ROFF);
  EXPECT_LT(err(y, "rope.y"), kTol);
  EXPECT_LT(err(dx, "rope.dx"), kTol);
}

TEST_F(TorchReference, CausalGqaAttention) {
  std::vector<float> y(AB * AT * AH * AHD), lse(AB * AH * AT), dqkv(in["attn.qkv"].size(), 0.0f);
  cpu::attention_forward(y.data(), lse.data(), in["attn.qkv"].data(), AB, AT, AH, AKV, AHD);
  cpu::attention_backward(dqkv.data(), in["attn.dy"].data(), in["attn.qkv"].data(), y.data(), lse.data(), AB, AT, AH,
                          AKV, AHD);
  EXPECT_LT(err(y, "attn.y"), kTol);
  EXPECT_LT(err(lse, "attn.lse"), kTol);
  EXPECT_LT(err(dqkv, "attn.dqkv"), kTol);
}

TEST_F(TorchReference, CrossEntropyIgnoringNegativeTargets) {
  std::vector<float> loss(CE_N), lse(CE_N), d(CE_N * CE_V);
  cpu::crossentropy_forward(loss.data(), lse.data(), in["ce.logits"].data(), targets.data(), CE_N, CE_V);
  cpu::crossentropy_backward(d.data(), in["ce.dl"].data(), in["ce.logits"].data(), lse.data(), targets.data(), CE_N,
                             CE_V);
  EXPECT_LT(err(loss, "ce.loss"), kTol);
  EXPECT_LT(err(lse, "ce.lse"), kTol);
  EXPECT_LT(err(d, "ce.dlogits"), kTol);
  EXPECT_EQ(loss[1], 0.0f);
}
