#include "models/moe/moe_config.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace atl::nn {

void MoEModelConfig::validate() const {
  attn.validate();
  ATOLL_CHECK(n_dense_layers >= 0 && n_dense_layers <= attn.n_layer,
              "model.n_dense_layers = {} must be between 0 and n_layer = {}", n_dense_layers, attn.n_layer);
  ATOLL_CHECK(moe.dim == attn.n_embd, "model: MoE width {} is not n_embd {}", moe.dim, attn.n_embd);
  moe.validate("model");
}

std::string MoEModelConfig::describe() const {
  return fmt::format("L={} ({} dense) d={} heads={}/{} experts={} top{} ffn={}{} {} router V={}", attn.n_layer,
                     n_dense_layers, attn.n_embd, attn.n_head, attn.n_kv_head, moe.n_experts, moe.top_k, moe.expert_ffn,
                     moe.n_shared > 0 ? fmt::format(" +{} shared", moe.n_shared) : "", moe.score, attn.vocab_size);
}

MoEModelConfig MoEModelConfig::preset(const std::string& name) {
  MoEModelConfig c;
  GPTConfig& a = c.attn;
  a.rms_norm = a.swiglu = a.rope = true;
  a.tied_head = a.bias = false;
  a.vocab_size = 257;
  if (name == "moe-tiny") {
    a.n_layer = 3, a.n_embd = 32, a.n_head = 4, a.n_kv_head = 2, a.block_size = 64, a.ffn_hidden = 64;
    c.moe.n_experts = 8, c.moe.top_k = 2, c.moe.expert_ffn = 16, c.moe.n_shared = 1;
  } else if (name == "moe-small") {
    a.n_layer = 4, a.n_embd = 128, a.n_head = 4, a.n_kv_head = 4, a.block_size = 128, a.ffn_hidden = 256;
    c.moe.n_experts = 16, c.moe.top_k = 2, c.moe.expert_ffn = 64, c.moe.n_shared = 2;
  } else {
    fail("unknown MoE model preset '{}' (known: moe-tiny, moe-small)", name);
  }
  c.moe.dim = a.n_embd;
  return c;
}

MoEModelConfig MoEModelConfig::from_config(Config& cfg, const std::string& s) {
  MoEModelConfig c = preset(cfg.get_string(s + ".preset", "moe-tiny", {"moe-tiny", "moe-small"}));
  GPTConfig& a = c.attn;
  a.vocab_size = cfg.get_int(s + ".vocab_size", a.vocab_size, 2, 1 << 24);
  a.block_size = cfg.get_int(s + ".block_size", a.block_size, 1, 1 << 20);
  a.n_layer = cfg.get_int(s + ".n_layer", a.n_layer, 1, 1024);
  a.n_head = cfg.get_int(s + ".n_head", a.n_head, 1, 1024);
  a.n_kv_head = cfg.get_int(s + ".n_kv_head", cfg.has(s + ".n_head") ? a.n_head : a.n_kv_head, 1, 1024);
  a.n_embd = cfg.get_int(s + ".n_embd", a.n_embd, 1, 1 << 16);
  a.ffn_hidden = cfg.get_int(s + ".dense_ffn", a.ffn_hidden, 0, 1 << 20);
  a.swiglu = cfg.get_string(s + ".mlp", a.swiglu ? "swiglu" : "gelu", {"gelu", "swiglu"}) == "swiglu";
  a.tied_head = cfg.get_bool(s + ".tied_head", a.tied_head);
  a.rope_theta = float(cfg.get_float(s + ".rope_theta", a.rope_theta, 1.0, 1e9));
  a.norm_eps = float(cfg.get_float(s + ".norm_eps", a.norm_eps, 1e-12, 1.0));
  c.n_dense_layers = cfg.get_int(s + ".n_dense_layers", c.n_dense_layers, 0, 1024);
  MoEConfig& m = c.moe;
  m.dim = a.n_embd;
  m.swiglu = a.swiglu;
  m.n_experts = cfg.get_int(s + ".n_experts", m.n_experts, 1, 1 << 16);
  // Range-checked here with the line; validate() repeats the checks for models built in code.
  m.top_k = cfg.get_int(s + ".top_k", m.top_k, 1, 1 << 16);
  ATOLL_CHECK(m.top_k <= m.n_experts, "{}.top_k = {} ({}) exceeds {}.n_experts = {}", s, m.top_k,
              cfg.where(s + ".top_k"), s, m.n_experts);
  m.expert_ffn = cfg.get_int(s + ".expert_ffn", m.expert_ffn, 1, 1 << 20);
  m.n_shared = cfg.get_int(s + ".n_shared_experts", m.n_shared, 0, 1 << 10);
  m.shared_ffn = cfg.get_int(s + ".shared_ffn", m.shared_ffn, 0, 1 << 20);
  m.score = cfg.get_string(s + ".router_score", m.score, {"softmax", "sigmoid"});
  m.norm_topk = cfg.get_bool(s + ".norm_topk_prob", m.norm_topk);
  m.drop_tokens = cfg.get_bool(s + ".drop_tokens", m.drop_tokens);
  if (cfg.has(s + ".capacity_factor")) {
    double cf = cfg.get_float(s + ".capacity_factor", m.capacity_factor);
    ATOLL_CHECK(cf > 0, "{}.capacity_factor = {} ({}) must be above 0 (drop_tokens = false computes every token)", s,
                cf, cfg.where(s + ".capacity_factor"));
    m.capacity_factor = cf;
  }
  m.expert_gemm = cfg.get_string(s + ".expert_gemm", m.expert_gemm, {"grouped", "loop"});
  m.aux_loss_coef = cfg.get_float(s + ".aux_loss_coef", m.aux_loss_coef, 0.0, 1e3);
  m.z_loss_coef = cfg.get_float(s + ".z_loss_coef", m.z_loss_coef, 0.0, 1e3);
  c.validate();
  return c;
}

std::map<std::string, std::string> MoEModelConfig::metadata() const {
  const GPTConfig& a = attn;
  nlohmann::json j = {{"vocab_size", a.vocab_size},   {"block_size", a.block_size},   {"n_layer", a.n_layer},
                      {"n_head", a.n_head},           {"n_kv_head", a.n_kv_head},     {"n_embd", a.n_embd},
                      {"dense_ffn", a.ffn()},         {"swiglu", a.swiglu},           {"tied_head", a.tied_head},
                      {"rope_theta", a.rope_theta},   {"norm_eps", a.norm_eps},       {"n_dense_layers", n_dense_layers},
                      {"n_experts", moe.n_experts},   {"top_k", moe.top_k},           {"expert_ffn", moe.expert_ffn},
                      {"n_shared", moe.n_shared},     {"shared_ffn", moe.shared_ffn}, {"score", moe.score},
                      {"norm_topk", moe.norm_topk},   {"drop_tokens", moe.drop_tokens},
                      {"capacity_factor", moe.capacity_factor}, {"aux_loss_coef", moe.aux_loss_coef},
                      {"z_loss_coef", moe.z_loss_coef}};
  return {{"atoll_model", j.dump()}};
}

MoEModelConfig MoEModelConfig::from_metadata(const std::map<std::string, std::string>& md) {
  auto it = md.find("atoll_model");
  ATOLL_CHECK(it != md.end(), "weights file has no atoll_model metadata");
  auto j = nlohmann::json::parse(it->second);
  MoEModelConfig c = preset("moe-tiny");
  GPTConfig& a = c.attn;
  a.vocab_size = j["vocab_size"], a.block_size = j["block_size"], a.n_layer = j["n_layer"];
  a.n_head = j["n_head"], a.n_kv_head = j["n_kv_head"], a.n_embd = j["n_embd"], a.ffn_hidden = j["dense_ffn"];
  a.swiglu = j["swiglu"], a.tied_head = j["tied_head"], a.rope_theta = j["rope_theta"], a.norm_eps = j["norm_eps"];
  c.n_dense_layers = j["n_dense_layers"];
  MoEConfig& m = c.moe;
  m.dim = a.n_embd, m.swiglu = a.swiglu;
  m.n_experts = j["n_experts"], m.top_k = j["top_k"], m.expert_ffn = j["expert_ffn"], m.n_shared = j["n_shared"];
  m.shared_ffn = j["shared_ffn"], m.score = j["score"], m.norm_topk = j["norm_topk"], m.drop_tokens = j["drop_tokens"];
  m.capacity_factor = j["capacity_factor"], m.aux_loss_coef = j["aux_loss_coef"], m.z_loss_coef = j["z_loss_coef"];
  c.validate();
  return c;
}

}  // namespace atl::nn
