// Transformer shapes for the planner: dense (GPT-2/Llama style) and mixture-of-experts, with
// multi-head latent attention (DeepSeek-V2/V3) as an option. Parameter counts follow the layer
// shapes exactly so they can be checked against the engine's counted parameters.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atl {
class Config;
}

namespace atl::plan {

struct ModelSpec {
  std::string name = "custom";
  int64_t layers = 12, hidden = 768, heads = 12, kv_heads = 12;
  int64_t head_dim = 0;  // 0: hidden / heads
  int64_t ffn = 3072;
  std::string ffn_type = "gelu";  // "gelu" (two matrices) or "swiglu" (three)
  int64_t vocab = 50257, seq = 1024;
  bool tied_head = true;
  bool bias = true;                 // linear biases (GPT-2) or none (Llama)
  std::string norm = "layernorm";   // "layernorm" (weight+bias) or "rmsnorm" (weight)
  std::string position = "learned"; // "learned" (a [seq, hidden] table) or "rope" (no parameters)
  bool qk_norm = false;             // per-head RMSNorm on q and k (Qwen3)
  // Execution properties that shape activation memory (Korthikanti et al. 2022, Table 2):
  std::string attention = "flash";  // "standard" keeps the [b,a,s,s] softmax, "flash" does not
  // Which fused kernel runs flash attention (time only; memory is the same): "flash2"
  // (FlashAttention-2, Dao 2023) or "triton" (the Triton FlashAttention of flash-attn 1.x, which
  // llm-foundry runs for attn_impl: triton). predict.cpp says what each one's ceilings are.
  std::string attention_kernel = "flash2";
  // Packed rows of several documents under document masks (Data-Centric Parallel): Σ len² of a
  // row's documents, the mean over the micro-batch's rows; flash attention then costs the sum of
  // per-document causal attention instead of causal attention over all `seq`. 0: one document
  // of `seq` per row.
  double attention_sq_len = 0;
  bool dropout = false;             // dropout masks are stored when on
  // Multi-head latent attention (DeepSeek-V2 §2.1): used when kv_lora_rank > 0.
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_rope_dim = 0, qk_nope_dim = 0, v_head_dim = 0;
  // Mixture of experts: used when experts > 0.
  int64_t experts = 0, top_k = 0, shared_experts = 0, expert_ffn = 0;
  int64_t first_dense_layers = 0;  // leading layers with a dense FFN
  int64_t moe_every = 1;           // every n-th layer after those is MoE
  // Node-limited routing (DeepSeek-V3 §2.1.2): a token's experts lie on at most this many nodes, so
  // it crosses the network once per node and is forwarded to its experts there over NVLink (0: off).
  int64_t route_nodes = 0;

  bool is_moe() const { return experts > 0; }
  bool is_mla() const { return kv_lora_rank > 0; }
  int64_t hd() const { return head_dim > 0 ? head_dim : hidden / heads; }
  int64_t q_dim() const;       // width of the query projection output
  int64_t kv_dim() const;      // width of each of K and V (GQA: kv_heads * head_dim)
  int64_t score_dim() const;   // per-head q·k width summed over heads
  int64_t value_dim() const;   // per-head v width summed over heads
  bool layer_is_moe(int64_t l) const;
  int64_t moe_layers() const;

  // Parameters of one layer's pieces.
  int64_t attn_params() const;
  int64_t norm_params() const;  // per norm
  int64_t dense_ffn_params() const;
  int64_t expert_params() const;  // one routed expert
  int64_t moe_ffn_params() const;  // all experts + shared + router
  int64_t layer_params(int64_t l) const;
  int64_t embedding_params() const;  // token (+ learned position) embeddings
  int64_t head_params() const;       // output projection when untied, else 0
  int64_t total_params() const;
  // Parameters one token passes through (MoE: top_k routed + shared experts).
  int64_t active_params() const;
  // Matmul FLOPs of one token's forward pass, excluding attention scores; attention scores
  // for a full (non-causal, as Megatron counts) sequence are added by attn_score_flops.
  double matmul_flops_per_token() const;
  double attn_score_flops_per_token() const;  // 2·2·s·(score+value widths) per layer
  // Training FLOPs per token (forward + backward = 3x forward), with full recompute 4x for the
  // transformer layers (Narayanan et al. 2021, eq. 3), selective adds the attention core once.
  double train_flops_per_token(const std::string& recompute) const;
  void validate() const;
};

// Built-in presets; `known_presets()` lists them for error messages.
ModelSpec model_preset(const std::string& name);
std::vector<std::string> known_presets();

// Reads the [model] section: `preset = "..."` then any field overrides.
ModelSpec load_model(Config& cfg, const std::string& section = "model");

}  // namespace atl::plan
