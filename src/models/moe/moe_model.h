// The MoE decoder (family "moe", moe_family.cpp): token embedding, n_layer pre-norm blocks of
// GPT's attention (models/gpt, RoPE and grouped-query heads) and either a dense FFN (the first
// n_dense_layers) or an MoE layer (nn/moe.h), a final RMSNorm and an untied head. The training
// loss is the cross-entropy plus every MoE layer's coefficient-weighted balance and z losses;
// without gradients (evaluation) it is the cross-entropy alone.
// Parameter names follow Qwen2-MoE / DeepSeek where the layout allows (docs/moe.md lists them).
#pragma once
#include <variant>

#include "models/gpt/gpt.h"
#include "models/moe/moe_config.h"
#include "nn/moe.h"

namespace atl::nn {

class MoEBlock : public Module {
 public:
  // moe null: dense FFN. tp: the tensor-parallel context of a shard (null: the whole model).
  MoEBlock(std::string prefix, const GPTConfig& a, const MoEConfig* moe, const TensorParallelContext* tp = nullptr);
  Tensor operator()(const Tensor& x) const;
  Norm* input_layernorm;
  Attention* self_attn;
  Norm* post_attention_layernorm;
  FeedForward* dense = nullptr;  // "mlp" of a dense layer
  MoELayer* moe = nullptr;       // "mlp" of an MoE layer
};

class MoEModel : public Model, public TokenModel, public ExpertModel, public SequenceSharded, public PipelineStages {
 public:
  // tp: build this tp rank's shard (parallelize.cpp's plan): attention, dense FFNs and shared
  // experts tensor-parallel, embedding and head split by vocabulary rows, routed experts whole
  // (replicated over tp; split over ep by expert_shard). Null: the whole model.
  explicit MoEModel(const MoEModelConfig& c, const TensorParallelContext* tp = nullptr);
  const MoEModelConfig& config() const { return c_; }
  std::string family() const override { return "moe"; }
  std::string describe() const override { return c_.describe(); }
  int64_t vocab_size() const override { return c_.attn.vocab_size; }
  int64_t max_sequence_length() const override { return c_.attn.block_size; }
  void init_weights(uint64_t seed) override;

  Tensor hidden(const Tensor& tokens) const;
  Tensor loss(const Tensor& tokens, const Tensor& targets) const override;
  Tensor forward(const Tensor& tokens) const override;
  std::vector<Module*> blocks() override { return {layers.begin(), layers.end()}; }
  // Pipeline stages (nn/pipeline_stages.h): together loss(), the routers' auxiliary losses handed
  // to the pipeline per stage (stage_take_aux_loss) rather than added by the last stage.
  void stage_begin(const Shape& in) const override;
  Tensor stage_input(const Tensor& tokens) const override;
  Tensor stage_blocks(const Tensor& x, int64_t first, int64_t last) const override;
  Shape stage_hidden_shape(const Shape& in) const override;
  Tensor stage_loss(const Tensor& x, const Tensor& targets) const override;
  Tensor stage_take_aux_loss() const override;
  // "selective" recomputes a block's attention core (as GPT's); "full" is run_blocks' checkpoint
  // for a dense block, and for an MoE block one that also returns the layer's auxiliary loss
  // (hidden()), without which the recomputed router would get no balance or z-loss gradient.
  void set_recompute(std::vector<Recompute> per_block) override;
  bool head_reads_lower_root() const override { return lm_head == nullptr; }
  ParallelPlan parallelize() const override;  // parallelize.cpp
  std::map<std::string, std::string> config_metadata() const override;
  // Active parameters only: a routed expert's matmuls count top_k / n_experts times.
  double flops_per_token(int64_t T) const override;
  std::vector<std::pair<std::string, double>> step_metrics() const override;

  int64_t num_experts() const override { return c_.moe.n_experts; }
  void set_expert_dispatcher(ExpertDispatcher* d) override;
  std::unique_ptr<Model> expert_shard(int64_t ranks, int64_t rank) const override;
  std::vector<Parameter*> sharded_expert_parameters() const override;
  double activation_bytes(int64_t batch, int64_t seq) const override;
  std::vector<MoELayer*> moe_layers() const;
  // Context parallelism (GPT's, gpt_context.cpp): every layer runs on this rank's spans of each
  // row, attention through the ring, RoPE at the spans' global offsets, the cross-entropy scaled
  // by the group's loss_share and the routers' balance statistics summed over the group (nn/moe.h).
  // Refused with tensor parallelism and with token dropping (moe_model.cpp says why).
  void set_context_attention(const ContextAttention* cp) override;

  Embedding* embed_tokens;
  std::vector<MoEBlock*> layers;
  Norm* norm;
  // A child module, not a root parameter: the root's own parameters come first in the flat buffer,
  // which would put the head in ZeRO-3's lower root (released after the embedding lookup).
  Linear* lm_head = nullptr;  // [C, V]; null when tied to embed_tokens

 private:
  MoEModelConfig c_;
  const TensorParallelContext* tp_ = nullptr;
  int64_t vocab_lo_ = 0;             // first vocabulary row of this tp rank
  Tensor logits_of(const Tensor& h) const;  // [N, V_r] under tp, [.., V] without
  std::vector<bool> full_moe_;       // MoE blocks under "full" recompute (checkpointed in hidden())
  const ContextAttention* context_ = nullptr;
  mutable std::vector<Tensor> aux_;  // each MoE block's auxiliary loss of the last forward, in its graph
  mutable Tensor stage_aux_;         // the last stage_blocks call's auxiliary losses, summed
  mutable std::vector<bool> staged_;  // blocks a pipeline stage has run here (step_metrics averages those)
  // Block i on x; its auxiliary loss (an MoE block's) into aux. Full recompute included.
  Tensor run_block(size_t i, const Tensor& x, Tensor& aux) const;
  Tensor embed(const Tensor& tokens) const;  // this rank's spans (cp) -> the first block's input
};

}  // namespace atl::nn
