// Parameter counts and FLOPs of the planner's model shapes.
#include <gtest/gtest.h>

#include <cmath>

#include "core/config.h"
#include "core/error.h"
#include "plan/model_spec.h"

using namespace atl;
using namespace atl::plan;

TEST(PlanModel, Gpt2SmallParameterCountMatchesTiedHeadReference) {
  // Hugging Face GPT-2 (tied head, learned positions, biases): 124,439,808.
  EXPECT_EQ(model_preset("gpt2-124m").total_params(), 124439808);
}

TEST(PlanModel, Llama2_7bParameterCount) {
  EXPECT_EQ(model_preset("llama2-7b").total_params(), 6738415616);
}

TEST(PlanModel, LargerPresetsHaveTheirNominalSizes) {
  auto near = [](const char* n, double want, double tol) {
    double got = double(model_preset(n).total_params());
    EXPECT_NEAR(got / want, 1.0, tol) << n << " has " << got;
  };
  near("gpt2-355m", 354.8e6, 0.01);  // GPT-2 medium as released (tied head)
  near("gpt2-1.5b", 1.558e9, 0.01);
  near("llama2-13b", 13.016e9, 0.005);
  near("llama2-70b", 68.98e9, 0.005);
  near("llama3-8b", 8.03e9, 0.005);
  near("llama3-70b", 70.55e9, 0.005);
  near("llama3-405b", 405.8e9, 0.005);
  near("qwen3-32b", 32.76e9, 0.01);
  near("deepseek-v3", 671e9, 0.01);
  // DeepSeek-V3 activates about 37B parameters per token.
  EXPECT_NEAR(double(model_preset("deepseek-v3").active_params()) / 37e9, 1.0, 0.05);
  EXPECT_EQ(model_preset("llama3-8b").active_params(), model_preset("llama3-8b").total_params());
}

// Narayanan et al. 2021 eq. 3: F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration with
// recompute; without recompute the coefficient is 72 and the logit term V/(12·l·h).
TEST(PlanModel, FlopsPerTokenMatchNarayananFormula) {
  struct Shape { int64_t l, h, a, s, V; };
  for (Shape x : {Shape{24, 2304, 24, 2048, 51200}, Shape{96, 12288, 96, 2048, 51200},
                  Shape{128, 25600, 160, 2048, 51200}, Shape{12, 768, 12, 1024, 50257}}) {
    ModelSpec m = model_preset("gpt2-124m");
    m.layers = x.l, m.hidden = x.h, m.heads = m.kv_heads = x.a, m.ffn = 4 * x.h, m.seq = x.s, m.vocab = x.V;
    double l = x.l, h = x.h, s = x.s, V = x.V;
    double with_rc = 96 * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    double without = 72 * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    EXPECT_NEAR(m.train_flops_per_token("full") / with_rc, 1.0, 1e-12) << x.h;
    EXPECT_NEAR(m.train_flops_per_token("none") / without, 1.0, 1e-12) << x.h;
    // Selective recompute only repeats the attention scores: 4·2·s·h per layer per token (QKᵀ and AV).
    EXPECT_NEAR(m.train_flops_per_token("selective") - m.train_flops_per_token("none"), 2.0 * 2 * s * h * l, 1.0);
  }
}

TEST(PlanModel, MoeFlopsCountOnlyActiveExperts) {
  ModelSpec m = model_preset("llama2-7b");
  double dense = m.matmul_flops_per_token();
  m.experts = 8, m.top_k = 2, m.expert_ffn = m.ffn, m.shared_experts = 0;
  // Two experts' FFNs per token plus the router (2·h·E per token).
  double ffn = 2.0 * 3 * m.hidden * m.ffn;
  EXPECT_NEAR(m.matmul_flops_per_token(), dense + m.layers * (ffn + 2.0 * m.hidden * 8), 1.0);
  EXPECT_GT(m.total_params(), 7 * model_preset("llama2-7b").total_params() / 2);
}

TEST(PlanModel, UnknownPresetListsKnownOnes) {
  try {
    model_preset("llama3-9b");
    FAIL() << "accepted an unknown preset";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("llama3-8b"), std::string::npos) << m;
    EXPECT_NE(m.find("gpt2-124m"), std::string::npos) << m;
    EXPECT_NE(m.find("deepseek-v3"), std::string::npos) << m;
  }
}

TEST(PlanModel, CustomTomlModelWithMoeFields) {
  Config c = Config::parse(
      "[model]\nname = \"tiny-moe\"\nlayers = 4\nhidden = 256\nheads = 8\nkv_heads = 2\nffn = 1024\n"
      "ffn_type = \"swiglu\"\nvocab = 1000\nseq = 128\ntied_head = false\nbias = false\nnorm = \"rmsnorm\"\n"
      "position = \"rope\"\nexperts = 4\ntop_k = 1\nexpert_ffn = 512\nfirst_dense_layers = 1\n",
      "m.toml");
  ModelSpec m = load_model(c);
  EXPECT_NO_THROW(c.finish());
  EXPECT_EQ(m.moe_layers(), 3);
  int64_t attn = 256 * (256 + 2 * 64) + 256 * 256;
  int64_t dense_layer = attn + 2 * 256 + 3 * 256 * 1024;
  int64_t moe_layer = attn + 2 * 256 + 4 * 3 * 256 * 512 + 4 * 256;
  EXPECT_EQ(m.total_params(), 2 * 1000 * 256 + 256 + dense_layer + 3 * moe_layer);
}

TEST(PlanModel, MalformedModelKeyIsReportedWithLineAndNearestKey) {
  Config c = Config::parse("[model]\npreset = \"gpt2-124m\"\nlayer = 6\n", "m.toml");
  load_model(c);
  try {
    c.finish();
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("m.toml:3"), std::string::npos) << m;
    EXPECT_NE(m.find("model.layers"), std::string::npos) << m;
  }
  Config bad = Config::parse("[model]\nlayers = \"six\"\n", "m.toml");
  EXPECT_THROW(load_model(bad), Error);
}
