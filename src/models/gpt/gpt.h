// The GPT model: token (+ position) embedding, n_layer pre-norm transformer blocks, a final norm
// and the LM head. One class covers GPT-2 and Llama-style models through GPTConfig.
#pragma once
#include <map>

#include "models/gpt/gpt_config.h"
#include "nn/layers.h"
#include "optim/optimizer.h"
#include "tensor/rng.h"

namespace atl::nn {

class Attention : public Module {
 public:
  Attention(std::string prefix, const GPTConfig& c);
  Tensor operator()(const Tensor& x) const;
  Linear* c_attn;
  Linear* c_proj;

 private:
  const GPTConfig& c_;
};

class MLP : public Module {
 public:
  MLP(std::string prefix, const GPTConfig& c);
  Tensor operator()(const Tensor& x) const;
  Linear* c_fc;  // [C, F] (GELU) or [C, 2F] = [gate | up] (SwiGLU)
  Linear* c_proj;

 private:
  const GPTConfig& c_;
};

class Block : public Module {
 public:
  Block(std::string prefix, const GPTConfig& c);
  Tensor operator()(const Tensor& x) const;
  Norm* ln_1;
  Attention* attn;
  Norm* ln_2;
  MLP* mlp;
};

// Callbacks around each transformer block, for parallelism that must act just before a block
// runs (ZeRO-3/FSDP gathers the block's sharded parameters there and frees them after). With
// hooks set and gradients recorded, hidden() adds a pass-through node before and after each block
// so the backward calls arrive when the block's backward starts and ends. Without hooks (the
// default) nothing changes.
struct BlockHooks {
  virtual ~BlockHooks() = default;
  virtual void forward_begin() {}  // start of hidden(), before the embeddings
  virtual void before_forward(int64_t block) {}
  virtual void after_forward(int64_t block) {}
  virtual void before_backward(int64_t block) {}
  virtual void after_backward(int64_t block) {}
};

class GPT : public Module {
 public:
  explicit GPT(const GPTConfig& c);
  const GPTConfig& config() const { return c_; }

  // GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2*n_layer), norms 1, biases 0.
  void init_weights(uint64_t seed);

  // tokens [B,T] i32 -> final hidden states [B,T,C] (records the graph when grad is on).
  Tensor hidden(const Tensor& tokens) const;
  // tokens, targets [B,T] -> scalar mean cross-entropy (the training forward).
  Tensor loss(const Tensor& tokens, const Tensor& targets) const;
  // tokens [B,T] -> logits [B,T,V].
  Tensor logits(const Tensor& tokens) const;

  Parameter* head_weight() const;  // [V, C]: wte when tied, else lm_head
  std::vector<ParamRef> param_refs();
  void zero_grad();
  const Tensor& flat_values() const { return flat_values_; }
  const Tensor& flat_grads() const { return flat_grads_; }

  // Weights with Hugging Face GPT-2 names (the tied head is not written, as in HF's files).
  std::vector<std::pair<std::string, Tensor>> state_dict();
  void load_state_dict(const std::vector<std::pair<std::string, Tensor>>& sd, const std::string& what);
  std::map<std::string, std::string> config_metadata() const;

  // Training FLOPs per token: 6 per parameter of the matmuls plus attention's 12*L*C*T (PaLM, app. B).
  double flops_per_token(int64_t T) const;

  // Autoregressive sampling (full recompute per token; T limited to block_size).
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, float temperature,
                                int64_t top_k, Rng& rng) const;

  Embedding* wte;
  Embedding* wpe = nullptr;
  std::vector<Block*> h;
  Norm* ln_f;
  Parameter* lm_head = nullptr;

  // nullptr (the default) removes them; the hooks must outlive their use.
  void set_block_hooks(BlockHooks* h) { hooks_ = h; }

 private:
  GPTConfig c_;
  BlockHooks* hooks_ = nullptr;
};

GPTConfig config_from_metadata(const std::map<std::string, std::string>& md);

}  // namespace atl::nn
