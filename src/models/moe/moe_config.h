// The MoE family's configuration (DeepSeek-MoE / Qwen-MoE-like): a Llama-style decoder (RoPE,
// RMSNorm, grouped-query attention reused from models/gpt) whose first n_dense_layers have a
// dense SwiGLU/GELU FFN and the rest a mixture-of-experts layer (nn/moe.h) with fine-grained
// routed experts and optional shared experts.
#pragma once
#include <map>
#include <string>

#include "core/config.h"
#include "models/gpt/gpt_config.h"
#include "nn/moe.h"

namespace atl::nn {

struct MoEModelConfig {
  GPTConfig attn;            // vocab, block size, layers, heads, width, norms, RoPE (ffn_hidden: the dense FFN)
  int64_t n_dense_layers = 1;
  MoEConfig moe;             // dim = attn.n_embd

  void validate() const;
  std::string describe() const;
  // moe-tiny (tests), moe-small (configs/moe-small.toml).
  static MoEModelConfig preset(const std::string& name);
  // [model] family = "moe": preset, then any key overrides it (docs/moe.md lists them).
  static MoEModelConfig from_config(Config& cfg, const std::string& section = "model");
  std::map<std::string, std::string> metadata() const;
  static MoEModelConfig from_metadata(const std::map<std::string, std::string>& md);
};

}  // namespace atl::nn
