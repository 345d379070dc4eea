// The GPT model: token (+ position) embedding, n_layer pre-norm transformer blocks, a final norm
// and the LM head. One class covers GPT-2 and Llama-style models through GPTConfig; registered as
// model family "gpt" (gpt_family.cpp), its parallelisms in parallelize.cpp.
#pragma once
#include <map>

#include "models/gpt/gpt_config.h"
#include "nn/context_attention.h"
#include "nn/document_mask.h"
#include "nn/kv_cache.h"
#include "nn/layers.h"
#include "nn/model.h"
#include "nn/pipeline_stages.h"
#include "nn/policy_model.h"
#include "nn/tensor_parallel.h"
#include "tensor/rng.h"

namespace atl::nn {

// tp (optional): this rank's shard of a tensor-parallel group: heads, KV heads and the MLP's
// hidden units split over the group, the linears column- and row-parallel (parallelize.cpp).
class Attention : public Module {
 public:
  Attention(std::string prefix, const GPTConfig& c, const TensorParallelContext* tp = nullptr);
  Tensor operator()(const Tensor& x) const;
  // qkv -> the heads' outputs: RoPE (at global positions) and attention, local or context-parallel.
  Tensor core(const Tensor& qkv) const;
  Linear* c_attn;
  Linear* c_proj;
  bool recompute_core = false;               // [train] recompute = "selective"
  const ContextAttention* context = nullptr;  // set by GPT::set_context_attention
  const Tensor* doc_ids = nullptr;            // set by GPT::set_document_ids (packed documents)
  const Tensor* positions = nullptr;          // set by GPT::set_position_ids (RoPE per document)

 private:
  const GPTConfig& c_;
  const TensorParallelContext* tp_;
  int64_t heads_, kv_heads_;  // this rank's
};

class MLP : public Module {
 public:
  MLP(std::string prefix, const GPTConfig& c, const TensorParallelContext* tp = nullptr);
  Tensor operator()(const Tensor& x) const;
  Linear* c_fc;  // [C, F] (GELU) or [C, 2F] = [gate | up] (SwiGLU); under tp this rank's [gate_r | up_r]
  Linear* c_proj;

 private:
  const GPTConfig& c_;
  const TensorParallelContext* tp_;
};

class Block : public Module {
 public:
  Block(std::string prefix, const GPTConfig& c, const TensorParallelContext* tp = nullptr);
  Tensor operator()(const Tensor& x) const;
  Norm* ln_1;
  Attention* attn;
  Norm* ln_2;
  MLP* mlp;
};

class GPT : public Model,
            public TokenGenerator,
            public SequenceSharded,
            public DocumentMasked,
            public PipelineStages,
            public PolicyModel {
 public:
  // tp: build rank tp->rank()'s shard of a tensor-parallel group (see parallelize.cpp); the
  // context must outlive the model. Null: the whole model.
  explicit GPT(const GPTConfig& c, const TensorParallelContext* tp = nullptr);
  const GPTConfig& config() const { return c_; }
  std::string family() const override { return "gpt"; }
  std::string describe() const override { return c_.describe(); }
  int64_t vocab_size() const override { return c_.vocab_size; }
  int64_t max_sequence_length() const override { return c_.block_size; }

  // GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2*n_layer), norms 1, biases 0.
  void init_weights(uint64_t seed) override;

  // tokens [B,T] i32 -> final hidden states [B,T,C] (records the graph when grad is on).
  Tensor hidden(const Tensor& tokens) const;
  // tokens, targets [B,T] -> scalar mean cross-entropy (the training forward).
  Tensor loss(const Tensor& tokens, const Tensor& targets) const override;
  // tokens [B,T] -> logits [B,T,V].
  Tensor logits(const Tensor& tokens) const;
  Tensor forward(const Tensor& tokens) const override { return logits(tokens); }

  Parameter* head_weight() const;  // [V, C]: wte when tied, else lm_head

  // The forward cut at block boundaries, for pipeline stages (nn/pipeline_stages.h): embedding,
  // blocks [first, last), final norm + head + loss. Together they are loss().
  Tensor stage_input(const Tensor& tokens) const override;
  Tensor stage_blocks(const Tensor& x, int64_t first, int64_t last) const override;
  Tensor stage_loss(const Tensor& x, const Tensor& targets) const override;
  void stage_begin(const Shape& in) const override;
  Shape stage_hidden_shape(const Shape& in) const override;

  // The sharding units are the transformer blocks; a tied head reads the embedding table.
  std::vector<Module*> blocks() override { return {h.begin(), h.end()}; }
  // An untied lm_head is a root parameter, and a root's own parameters come first in the flat
  // buffer: it sits in the lower root too, so either way the head reads the lower root.
  bool head_reads_lower_root() const override { return true; }
  ParallelPlan parallelize() const override;  // parallelize.cpp
  // Context parallelism (gpt_context.cpp): with cp set, loss() runs on this rank's spans of each
  // row and attention reaches the others through cp; logits() and generation stay local.
  void set_context_attention(const ContextAttention* cp) override;
  void set_recompute(std::vector<Recompute> per_block) override;
  // Packed documents (nn/document_mask.h; gpt_context.cpp): attention within each document.
  void set_document_ids(const Tensor& doc_ids) override;
  void set_position_ids(const Tensor& positions) override;

  // Weights keep Hugging Face GPT-2 names (the tied head is not written, as in HF's files, and
  // is ignored when a file carries it).
  const StateDictAdapter& state_dict_adapter() const override;
  std::map<std::string, std::string> config_metadata() const override;

  // Training FLOPs per token: 6 per parameter of the matmuls plus attention's 12*L*C*T (PaLM, app. B).
  double flops_per_token(int64_t T) const override;
  std::optional<TransformerShape> transformer_shape() const override {
    return TransformerShape{c_.n_layer, c_.n_embd,   c_.n_head, c_.n_kv_head, c_.ffn(), c_.vocab_size,
                            c_.swiglu,  c_.tied_head, c_.bias,  c_.rms_norm,  c_.rope};
  }

  // Autoregressive sampling (full recompute per token; T limited to block_size).
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, float temperature,
                                int64_t top_k, Rng& rng) const override;

  // ---- cached inference (gpt_cached.cpp) ----
  // A cache for `batch` rows of up to `capacity` positions (at most block_size).
  KVCache make_kv_cache(int64_t batch, int64_t capacity) const;
  // Inference forward over new tokens [B,T] after what `cache` holds: row b's token t sits at
  // position cache.length(b) + t (learned positions and RoPE alike). Only the first n_new[b]
  // tokens of row b are real; the rest is right padding and never read. Appends the real tokens'
  // keys and values to the cache and returns logits [B,V] at each row's last real token (zeros
  // for a row with none). Records no graph.
  Tensor forward_cached(const Tensor& tokens, KVCache& cache, const std::vector<int64_t>& n_new) const;

  // ---- RL policy (nn/policy_model.h; gpt_policy.cpp) ----
  Tensor features(const Tensor& tokens) const override;
  Tensor head(const Tensor& features) const override;
  int64_t feature_dim() const override;
  std::vector<Completion> generate_batch(const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens,
                                         const SamplingConfig& s) const override;

  Embedding* wte;
  Embedding* wpe = nullptr;
  std::vector<Block*> h;
  Norm* ln_f;
  Parameter* lm_head = nullptr;
  const TensorParallelContext* tensor_parallel() const { return tp_; }

 private:
  Tensor loss_context_parallel(const Tensor& tokens, const Tensor& targets) const;  // gpt_context.cpp
  // Its two ends, also the first and last pipeline stage's under pp x cp: this rank's spans of
  // every row embedded at their global positions; the head's loss over the same spans' targets,
  // scaled by the cp group's loss_share (collective over it).
  Tensor context_embedding(const Tensor& tokens) const;
  Tensor context_head_loss(const Tensor& x, const Tensor& targets) const;
  Tensor tp_logits(const Tensor& tokens) const;  // [B*T, V_r] under tensor parallelism
  GPTConfig c_;
  const ContextAttention* context_ = nullptr;
  Tensor doc_ids_;  // set_document_ids
  Tensor pos_ids_;  // set_position_ids
  // wpe's rows at positions pos [B, T] i32 -> [B, T, C] (gpt_context.cpp).
  Tensor learned_positions(const Tensor& pos) const;
  const TensorParallelContext* tp_ = nullptr;
  int64_t vocab_lo_ = 0;  // first vocabulary row of this rank's tables
};

// Refuses a tensor-parallel split of `tp` ranks this model cannot take, naming parallel.tp (parallelize.cpp).
void check_tensor_parallel(const GPTConfig& c, int64_t tp);

GPTConfig config_from_metadata(const std::map<std::string, std::string>& md);

}  // namespace atl::nn
