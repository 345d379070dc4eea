// The GPT family's configuration: GPT-2 (learned positions, LayerNorm, GELU, tied head, biases)
// and Llama-style choices (RoPE, RMSNorm, SwiGLU, untied head, grouped-query attention).
#pragma once
#include <string>

#include "core/config.h"

namespace atl::nn {

struct GPTConfig {
  int64_t vocab_size = 50257;
  int64_t block_size = 1024;  // longest sequence (learned positions / RoPE table bound)
  int64_t n_layer = 12, n_head = 12, n_kv_head = 12, n_embd = 768;
  int64_t ffn_hidden = 0;  // 0: 4*n_embd for GELU, the Llama rule (8/3*n_embd, rounded up to 64) for SwiGLU
  bool rms_norm = false;
  bool swiglu = false;
  bool rope = false;  // false: learned absolute positions (wpe)
  bool tied_head = true;
  bool bias = true;
  float rope_theta = 10000.f;
  float norm_eps = 1e-5f;

  int64_t head_dim() const { return n_embd / n_head; }
  int64_t ffn() const;
  void validate() const;
  std::string describe() const;

  // Named presets: gpt2 (124M), gpt2-medium, gpt2-large, gpt2-xl, gpt2-tiny, llama-tiny, d384.
  static GPTConfig preset(const std::string& name);
  // Reads [model]: preset = "...", then any field overrides it.
  static GPTConfig from_config(Config& cfg, const std::string& section = "model");
};

}  // namespace atl::nn
