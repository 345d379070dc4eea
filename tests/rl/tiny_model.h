// The 2-layer, 32-wide GPT the RL tests train and generate with: small enough that a rollout, an
// update and a weight push take milliseconds, large enough that its generations depend on its weights.
#pragma once
#include <memory>
#include <string>

#include "core/config.h"
#include "nn/model.h"

namespace atl::rl::rltest {

inline constexpr const char* kTinyModel = R"(
[model]
preset = "gpt2"
vocab_size = 128
block_size = 16
n_layer = 2
n_head = 2
n_embd = 32
)";

// kTinyModel with an [rl] table made of `extra`.
inline Config rl_config(const std::string& extra) {
  return Config::parse(std::string(kTinyModel) + "\n[rl]\n" + extra, "test");
}

inline std::unique_ptr<nn::Model> tiny_model(uint64_t seed) {
  Config c = Config::parse(kTinyModel, "model");
  auto m = nn::make_model(c, "model");
  m->init_weights(seed);
  return m;
}

}  // namespace atl::rl::rltest
