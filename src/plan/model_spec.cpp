// Model shapes and parameter/FLOP counting for the planner.
// FLOPs follow Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
// Clusters Using Megatron-LM", eq. 3): every matmul of an [m,k]x[k,n] costs 2mkn, the backward
// pass costs twice the forward, full recompute repeats the forward of the transformer layers.
#include "plan/model_spec.h"

#include <algorithm>
#include <map>

#include "core/config.h"
#include "core/error.h"

namespace atl::plan {

int64_t ModelSpec::q_dim() const {
  if (is_mla()) return heads * (qk_nope_dim + qk_rope_dim);
  return heads * hd();
}
int64_t ModelSpec::kv_dim() const { return is_mla() ? heads * v_head_dim : kv_heads * hd(); }
int64_t ModelSpec::score_dim() const { return q_dim(); }
int64_t ModelSpec::value_dim() const { return is_mla() ? heads * v_head_dim : heads * hd(); }

bool ModelSpec::layer_is_moe(int64_t l) const {
  if (!is_moe() || l < first_dense_layers) return false;
  return (l - first_dense_layers) % std::max<int64_t>(1, moe_every) == 0;
}
int64_t ModelSpec::moe_layers() const {
  int64_t n = 0;
  for (int64_t l = 0; l < layers; ++l) n += layer_is_moe(l);
  return n;
}

int64_t ModelSpec::norm_params() const { return norm == "layernorm" ? 2 * hidden : hidden; }

int64_t ModelSpec::attn_params() const {
  int64_t h = hidden, b = bias ? 1 : 0;
  if (is_mla()) {
    // DeepSeek-V2 MLA: q down/up (or a direct q projection), joint kv down + rope key, kv up, output.
    int64_t qk_head = qk_nope_dim + qk_rope_dim;
    int64_t q = q_lora_rank > 0 ? h * q_lora_rank + q_lora_rank + q_lora_rank * heads * qk_head
                                : h * heads * qk_head;
    int64_t kv = h * (kv_lora_rank + qk_rope_dim) + kv_lora_rank +
                 kv_lora_rank * heads * (qk_nope_dim + v_head_dim);
    return q + kv + heads * v_head_dim * h;
  }
  int64_t qkv = h * (q_dim() + 2 * kv_dim()) + b * (q_dim() + 2 * kv_dim());
  int64_t out = q_dim() * h + b * h;
  int64_t qkn = qk_norm ? 2 * hd() : 0;
  return qkv + out + qkn;
}

static int64_t ffn_params(const ModelSpec& m, int64_t f) {
  int64_t h = m.hidden, b = m.bias ? 1 : 0;
  if (m.ffn_type == "swiglu") return 3 * h * f + b * (2 * f + h);
  return 2 * h * f + b * (f + h);
}
int64_t ModelSpec::dense_ffn_params() const { return ffn_params(*this, ffn); }
int64_t ModelSpec::expert_params() const { return ffn_params(*this, expert_ffn); }
int64_t ModelSpec::moe_ffn_params() const {
  return (experts + shared_experts) * expert_params() + experts * hidden;  // + router
}
int64_t ModelSpec::layer_params(int64_t l) const {
  return attn_params() + 2 * norm_params() + (layer_is_moe(l) ? moe_ffn_params() : dense_ffn_params());
}
int64_t ModelSpec::embedding_params() const {
  return vocab * hidden + (position == "learned" ? seq * hidden : 0);
}
int64_t ModelSpec::head_params() const { return tied_head ? 0 : vocab * hidden; }
int64_t ModelSpec::total_params() const {
  int64_t n = embedding_params() + head_params() + norm_params();  // + final norm
  for (int64_t l = 0; l < layers; ++l) n += layer_params(l);
  return n;
}
int64_t ModelSpec::active_params() const {
  int64_t n = embedding_params() + head_params() + norm_params();
  for (int64_t l = 0; l < layers; ++l) {
    if (layer_is_moe(l))
      n += attn_params() + 2 * norm_params() + (top_k + shared_experts) * expert_params() + experts * hidden;
    else
      n += layer_params(l);
  }
  return n;
}

double ModelSpec::matmul_flops_per_token() const {
  // Matmul weights one token multiplies: every layer's attention and active FFN, plus the
  // output projection (the input embedding is a lookup, not a matmul).
  double w = 0;
  for (int64_t l = 0; l < layers; ++l) {
    double attn = is_mla() ? double(attn_params()) : double(hidden) * (q_dim() + 2 * kv_dim()) + double(q_dim()) * hidden;
    double mult = ffn_type == "swiglu" ? 3.0 : 2.0;
    double ffn_w = layer_is_moe(l) ? (top_k + shared_experts) * mult * hidden * expert_ffn + double(experts) * hidden
                                   : mult * hidden * ffn;
    w += attn + ffn_w;
  }
  w += double(vocab) * hidden;
  return 2.0 * w;
}
double ModelSpec::attn_score_flops_per_token() const {
  // q·kᵀ over s keys and the weighted sum over s values, per layer.
  return double(layers) * 2.0 * seq * (score_dim() + value_dim());
}
double ModelSpec::train_flops_per_token(const std::string& recompute) const {
  double layer_fwd = matmul_flops_per_token() - 2.0 * vocab * hidden + attn_score_flops_per_token();
  double head_fwd = 2.0 * vocab * hidden;
  double f = 3.0 * (layer_fwd + head_fwd);
  if (recompute == "full") f += layer_fwd;
  else if (recompute == "selective") f += attn_score_flops_per_token();
  return f;
}

void ModelSpec::validate() const {
  ATOLL_CHECK(layers > 0 && hidden > 0 && heads > 0 && vocab > 0 && seq > 0,
              "model '{}': layers, hidden, heads, vocab and seq must be positive", name);
  ATOLL_CHECK(kv_heads > 0 && heads % kv_heads == 0,
              "model '{}': heads ({}) must be a multiple of kv_heads ({})", name, heads, kv_heads);
  ATOLL_CHECK(head_dim > 0 || hidden % heads == 0,
              "model '{}': hidden ({}) must be divisible by heads ({}) unless head_dim is set", name,
              hidden, heads);
  ATOLL_CHECK(ffn_type == "gelu" || ffn_type == "swiglu", "model '{}': ffn_type must be gelu or swiglu",
              name);
  ATOLL_CHECK(attention_kernel == "flash2" || (attention_kernel == "triton" && attention == "flash"),
              "model '{}': attention_kernel \"{}\" is a flash-attention kernel (\"flash2\" or \"triton\", with "
              "attention = \"flash\")", name, attention_kernel);
  if (is_moe())
    ATOLL_CHECK(top_k > 0 && top_k <= experts && expert_ffn > 0,
                "model '{}': MoE needs 0 < top_k ({}) <= experts ({}) and expert_ffn > 0", name, top_k,
                experts);
}

// ---- presets ----

static ModelSpec gpt2(const char* name, int64_t l, int64_t h, int64_t a) {
  ModelSpec m;
  m.name = name;
  m.layers = l, m.hidden = h, m.heads = a, m.kv_heads = a, m.ffn = 4 * h;
  m.vocab = 50257, m.seq = 1024, m.tied_head = true, m.bias = true;
  m.norm = "layernorm", m.position = "learned", m.ffn_type = "gelu";
  return m;
}
static ModelSpec llama(const char* name, int64_t l, int64_t h, int64_t a, int64_t kv, int64_t f,
                       int64_t v, int64_t s) {
  ModelSpec m;
  m.name = name;
  m.layers = l, m.hidden = h, m.heads = a, m.kv_heads = kv, m.ffn = f, m.vocab = v, m.seq = s;
  m.tied_head = false, m.bias = false, m.norm = "rmsnorm", m.position = "rope", m.ffn_type = "swiglu";
  return m;
}

static const std::map<std::string, ModelSpec>& presets() {
  static const std::map<std::string, ModelSpec> p = [] {
    std::map<std::string, ModelSpec> m;
    m["gpt2-124m"] = gpt2("gpt2-124m", 12, 768, 12);
    m["gpt2-355m"] = gpt2("gpt2-355m", 24, 1024, 16);
    m["gpt2-774m"] = gpt2("gpt2-774m", 36, 1280, 20);
    m["gpt2-1.5b"] = gpt2("gpt2-1.5b", 48, 1600, 25);
    m["llama2-7b"] = llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096);
    m["llama2-13b"] = llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096);
    m["llama2-70b"] = llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096);
    m["llama3-8b"] = llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192);
    m["llama3-70b"] = llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192);
    m["llama3-405b"] = llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192);
    ModelSpec q = llama("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, 4096);
    q.head_dim = 128, q.qk_norm = true;
    m["qwen3-32b"] = q;
    // DeepSeek-V3 (DeepSeek-AI 2024, Table/§4.2 hyper-parameters), without the MTP module.
    ModelSpec d = llama("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, 4096);
    d.q_lora_rank = 1536, d.kv_lora_rank = 512, d.qk_rope_dim = 64, d.qk_nope_dim = 128, d.v_head_dim = 128;
    d.experts = 256, d.top_k = 8, d.shared_experts = 1, d.expert_ffn = 2048, d.first_dense_layers = 3;
    d.route_nodes = 4;  // DeepSeek-V3 §2.1.2: each token is sent to at most 4 nodes
    m["deepseek-v3"] = d;
    return m;
  }();
  return p;
}

std::vector<std::string> known_presets() {
  std::vector<std::string> v;
  for (auto& [k, _] : presets()) v.push_back(k);
  return v;
}

ModelSpec model_preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string list;
    for (auto& k : known_presets()) list += (list.empty() ? "" : ", ") + k;
    fail("unknown model preset '{}'; known presets: {} (did you mean '{}'?)", name, list,
         nearest(name, known_presets()));
  }
  return it->second;
}

ModelSpec load_model(Config& cfg, const std::string& s) {
  ModelSpec m;
  std::string preset = cfg.get_string(s + ".preset", "");
  if (!preset.empty()) m = model_preset(preset);
  else m.name = cfg.get_string(s + ".name", "custom");
  if (!preset.empty()) m.name = cfg.get_string(s + ".name", m.name);
  const int64_t big = int64_t(1) << 40;
  m.layers = cfg.get_int(s + ".layers", m.layers, 1, 100000);
  m.hidden = cfg.get_int(s + ".hidden", m.hidden, 1, big);
  m.heads = cfg.get_int(s + ".heads", m.heads, 1, 1 << 20);
  m.kv_heads = cfg.get_int(s + ".kv_heads", cfg.has(s + ".heads") && !cfg.has(s + ".kv_heads") ? m.heads : m.kv_heads, 1, 1 << 20);
  m.head_dim = cfg.get_int(s + ".head_dim", m.head_dim, 0, 1 << 20);
  m.ffn = cfg.get_int(s + ".ffn", m.ffn, 1, big);
  m.ffn_type = cfg.get_string(s + ".ffn_type", m.ffn_type, {"gelu", "swiglu"});
  m.vocab = cfg.get_int(s + ".vocab", m.vocab, 1, big);
  m.seq = cfg.get_int(s + ".seq", m.seq, 1, big);
  m.tied_head = cfg.get_bool(s + ".tied_head", m.tied_head);
  m.bias = cfg.get_bool(s + ".bias", m.bias);
  m.norm = cfg.get_string(s + ".norm", m.norm, {"layernorm", "rmsnorm"});
  m.position = cfg.get_string(s + ".position", m.position, {"learned", "rope"});
  m.qk_norm = cfg.get_bool(s + ".qk_norm", m.qk_norm);
  m.attention = cfg.get_string(s + ".attention", m.attention, {"flash", "standard"});
  m.attention_kernel = cfg.get_string(s + ".attention_kernel", m.attention_kernel, {"flash2", "triton"});
  m.dropout = cfg.get_bool(s + ".dropout", m.dropout);
  m.q_lora_rank = cfg.get_int(s + ".q_lora_rank", m.q_lora_rank, 0, big);
  m.kv_lora_rank = cfg.get_int(s + ".kv_lora_rank", m.kv_lora_rank, 0, big);
  m.qk_rope_dim = cfg.get_int(s + ".qk_rope_dim", m.qk_rope_dim, 0, big);
  m.qk_nope_dim = cfg.get_int(s + ".qk_nope_dim", m.qk_nope_dim, 0, big);
  m.v_head_dim = cfg.get_int(s + ".v_head_dim", m.v_head_dim, 0, big);
  m.experts = cfg.get_int(s + ".experts", m.experts, 0, 1 << 20);
  m.top_k = cfg.get_int(s + ".top_k", m.top_k, 0, 1 << 20);
  m.shared_experts = cfg.get_int(s + ".shared_experts", m.shared_experts, 0, 1 << 20);
  m.expert_ffn = cfg.get_int(s + ".expert_ffn", m.expert_ffn, 0, big);
  m.first_dense_layers = cfg.get_int(s + ".first_dense_layers", m.first_dense_layers, 0, 100000);
  m.moe_every = cfg.get_int(s + ".moe_every", m.moe_every, 1, 100000);
  m.route_nodes = cfg.get_int(s + ".route_nodes", m.route_nodes, 0, 1 << 20);
  m.validate();
  return m;
}

}  // namespace atl::plan
