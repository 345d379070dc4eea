#include "models/gpt/gpt_config.h"

#include <fmt/format.h>

#include "core/error.h"

namespace atl::nn {

int64_t GPTConfig::ffn() const {
  if (ffn_hidden > 0) return ffn_hidden;
  if (!swiglu) return 4 * n_embd;
  int64_t f = 8 * n_embd / 3;
  return (f + 63) / 64 * 64;
}

void GPTConfig::validate() const {
  ATOLL_CHECK(vocab_size > 0 && n_layer > 0 && n_embd > 0 && block_size > 0, "model: sizes must be positive");
  ATOLL_CHECK(n_head > 0 && n_embd % n_head == 0, "model: n_embd {} is not divisible by n_head {}", n_embd, n_head);
  ATOLL_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0, "model: n_head {} is not divisible by n_kv_head {}", n_head,
              n_kv_head);
  ATOLL_CHECK(!rope || head_dim() % 2 == 0, "model: RoPE needs an even head dim, got {}", head_dim());
}

std::string GPTConfig::describe() const {
  return fmt::format("L={} d={} heads={}/{} ffn={} V={} T<={} {} {} {} {} head", n_layer, n_embd, n_head, n_kv_head,
                     ffn(), vocab_size, block_size, rms_norm ? "rmsnorm" : "layernorm", swiglu ? "swiglu" : "gelu",
                     rope ? "rope" : "learned-pos", tied_head ? "tied" : "untied");
}

GPTConfig GPTConfig::preset(const std::string& name) {
  GPTConfig c;
  auto gpt2 = [&](int64_t L, int64_t d, int64_t h) {
    c.n_layer = L;
    c.n_embd = d;
    c.n_head = c.n_kv_head = h;
  };
  auto llama = [&]() {
    c.rms_norm = c.swiglu = c.rope = true;
    c.tied_head = c.bias = false;
  };
  if (name == "gpt2") gpt2(12, 768, 12);
  else if (name == "gpt2-medium") gpt2(24, 1024, 16);
  else if (name == "gpt2-large") gpt2(36, 1280, 20);
  else if (name == "gpt2-xl") gpt2(48, 1600, 25);
  else if (name == "d384") gpt2(6, 384, 6);
  else if (name == "gpt2-tiny") { gpt2(2, 64, 4); c.vocab_size = 257; c.block_size = 64; }
  else if (name == "llama-tiny") { gpt2(2, 64, 4); c.n_kv_head = 2; c.vocab_size = 257; c.block_size = 64; llama(); }
  else fail("unknown model preset '{}' (known: gpt2, gpt2-medium, gpt2-large, gpt2-xl, d384, gpt2-tiny, llama-tiny)", name);
  return c;
}

GPTConfig GPTConfig::from_config(Config& cfg, const std::string& s) {
  GPTConfig c = preset(cfg.get_string(s + ".preset", "gpt2",
                                      {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "d384", "gpt2-tiny", "llama-tiny"}));
  c.vocab_size = cfg.get_int(s + ".vocab_size", c.vocab_size, 2, 1 << 24);
  c.block_size = cfg.get_int(s + ".block_size", c.block_size, 1, 1 << 20);
  c.n_layer = cfg.get_int(s + ".n_layer", c.n_layer, 1, 1024);
  c.n_head = cfg.get_int(s + ".n_head", c.n_head, 1, 1024);
  c.n_kv_head = cfg.get_int(s + ".n_kv_head", cfg.has(s + ".n_head") ? c.n_head : c.n_kv_head, 1, 1024);
  c.n_embd = cfg.get_int(s + ".n_embd", c.n_embd, 1, 1 << 16);
  c.ffn_hidden = cfg.get_int(s + ".ffn_hidden", c.ffn_hidden, 0, 1 << 20);
  c.rms_norm = cfg.get_string(s + ".norm", c.rms_norm ? "rmsnorm" : "layernorm", {"layernorm", "rmsnorm"}) == "rmsnorm";
  c.swiglu = cfg.get_string(s + ".mlp", c.swiglu ? "swiglu" : "gelu", {"gelu", "swiglu"}) == "swiglu";
  c.rope = cfg.get_string(s + ".position", c.rope ? "rope" : "learned", {"learned", "rope"}) == "rope";
  c.tied_head = cfg.get_bool(s + ".tied_head", c.tied_head);
  c.bias = cfg.get_bool(s + ".bias", c.bias);
  c.rope_theta = float(cfg.get_float(s + ".rope_theta", c.rope_theta, 1.0, 1e9));
  c.norm_eps = float(cfg.get_float(s + ".norm_eps", c.norm_eps, 1e-12, 1.0));
  c.validate();
  return c;
}

}  // namespace atl::nn
