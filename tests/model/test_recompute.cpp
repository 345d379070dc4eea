// [train] recompute on the GPT: none, selective (attention core) and full (whole block) give
// bit-identical losses and gradients, because recomputation reruns the same kernels in the same
// order on the same inputs (autograd/checkpoint.h); and full keeps less alive after the forward.
// GPT-2-style (learned positions, LayerNorm, GELU) and Llama-style (RoPE, RMSNorm, SwiGLU, GQA).
#include <gtest/gtest.h>

#include <cstring>

#include "core/config.h"
#include "core/threads.h"
#include "models/gpt/gpt.h"
#include "nn/recompute.h"
#include "tensor/allocator.h"

using namespace atl;

namespace {

struct Result {
  float loss = 0;
  std::vector<float> grads;
  size_t live_bytes = 0;  // held after the forward, before backward
};

Result step(const char* preset, const std::string& recompute) {
  nn::GPTConfig c = nn::GPTConfig::preset(preset);
  c.block_size = 32;
  nn::GPT m(c);
  m.init_weights(5);
  Config cfg = Config::parse("[train]\nrecompute = \"" + recompute + "\"\n", "test.toml");
  nn::apply_recompute_config(cfg, m);
  cfg.finish();
  const int64_t B = 2, T = 32;
  Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < B * T; ++i) {
    x.i32()[i] = int32_t((i * 7 + 3) % 50);
    y.i32()[i] = int32_t((i * 11 + 1) % 50);
  }
  m.zero_grad();
  Allocator& a = allocator_for(Device::cpu());
  size_t before = a.stats().current_bytes;
  Tensor loss = m.loss(x, y);
  Result r;
  r.live_bytes = a.stats().current_bytes - before;
  r.loss = loss.item();
  backward(loss);
  const Tensor& g = m.flat_grads();
  r.grads.assign(g.f32(), g.f32() + g.numel());
  return r;
}

}  // namespace

TEST(Recompute, NoneSelectiveFullGiveIdenticalGradients) {
  set_num_threads(1);  // tiny shapes: threads only add barrier waits on a loaded machine
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    Result none = step(preset, "none");
    double norm = 0;
    for (float v : none.grads) norm += double(v) * v;
    ASSERT_GT(norm, 1e-8) << preset;
    for (const char* mode : {"selective", "full", "full,none", "selective,full"}) {
      Result r = step(preset, mode);
      EXPECT_EQ(r.loss, none.loss) << preset << " " << mode;
      ASSERT_EQ(r.grads.size(), none.grads.size());
      EXPECT_EQ(std::memcmp(r.grads.data(), none.grads.data(), r.grads.size() * sizeof(float)), 0)
          << preset << ": recompute = " << mode << " changes the gradients";
    }
    // Full recomputation keeps only each block's input (and the head's activations) alive.
    EXPECT_LT(step(preset, "full").live_bytes, none.live_bytes / 2) << preset;
  }
}

TEST(Recompute, BadValuesAreRefusedNamingTheKey) {
  nn::GPT m(nn::GPTConfig::preset("gpt2-tiny"));
  auto error_of = [&](const std::string& v) {
    Config cfg = Config::parse("[train]\nrecompute = \"" + v + "\"\n", "run.toml");
    try {
      nn::apply_recompute_config(cfg, m);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = error_of("sometimes");
  EXPECT_NE(e.find("train.recompute (run.toml:2)"), std::string::npos) << e;
  EXPECT_NE(e.find("'sometimes' is not one of none, selective, full"), std::string::npos) << e;
  e = error_of("full,none,full");
  EXPECT_NE(e.find("names 3 blocks, but the model has"), std::string::npos) << e;
}
