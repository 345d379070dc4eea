// The model contract: what every layer above nn (optimizers, parallelisms, tasks, the trainer)
// may know about a model. A model is a Module tree whose parameters carry roles (module.h), whose
// sharding units ("blocks") are listed bottom up with hooks around their forward, whose weights
// save and load through a state dict with a name adapter, and whose training forward is one
// loss(input, target) call. Families live in src/models/<family>/ and register by name here.
#pragma once
#include <optional>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "autograd/checkpoint.h"
#include "core/registry.h"
#include "nn/module.h"
#include "nn/parallel_plan.h"
#include "tensor/rng.h"

namespace atl::nn {

// Callbacks around each sharding unit, for parallelism that must act just before a unit runs
// (ZeRO-3/FSDP gathers the unit's sharded parameters there and frees them after). With hooks set
// and gradients recorded, Model::run_blocks adds a pass-through node before and after each block
// so the backward calls arrive when the block's backward starts and ends. Without hooks (the
// default) nothing changes.
struct BlockHooks {
  virtual ~BlockHooks() = default;
  virtual void forward_begin() {}  // start of the forward, before the first (root) parameters are used
  virtual void before_forward(int64_t block) {}
  virtual void after_forward(int64_t block) {}
  virtual void before_backward(int64_t block) {}
  virtual void after_backward(int64_t block) {}
};

// Maps the model's parameter names to the names in weight files and back (Hugging Face GPT-2's
// names, say). The default keeps names as they are.
struct StateDictAdapter {
  virtual ~StateDictAdapter() = default;
  virtual std::string to_file(const std::string& param) const { return param; }
  virtual std::string from_file(const std::string& key) const { return key; }
  // A key a file may carry that the model does not hold (a tied head written out explicitly).
  virtual bool ignorable(const std::string& key) const { return false; }
};

// The dimensions of a transformer stack, as the planner's memory model takes them (the trainer's
// start-up memory check); a family that is no transformer gives none.
struct TransformerShape {
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0;
  bool swiglu = false, tied_head = false, bias = true, rms_norm = false, rope = false;
};

class Model : public Module {
 public:
  // The registered family name ("gpt", ...) and a one-line description of this configuration.
  virtual std::string family() const = 0;
  virtual std::string describe() const = 0;
  virtual void init_weights(uint64_t seed) = 0;

  // The training forward: a scalar loss (records the graph when grad is on).
  virtual Tensor loss(const Tensor& input, const Tensor& target) const = 0;
  // The model's output for an input (logits, predictions).
  virtual Tensor forward(const Tensor& input) const = 0;

  // Sharding units, bottom up; each holds a contiguous run of parameters. Parameters below the
  // first are the lower root (embeddings), above the last the upper root (final norm, head).
  virtual std::vector<Module*> blocks() { return {}; }
  // True when the output layer reads the lower root's parameters (a head tied to the embedding):
  // a sharding that frees the lower root after the input layer must keep it for the head.
  virtual bool head_reads_lower_root() const { return false; }
  // Which parallelisms apply to which modules (parallel_plan.h); by default the blocks are the
  // sharding units and nothing else is planned.
  virtual ParallelPlan parallelize() const;
  // Training FLOPs per sample of length T (tokens for sequence models), for MFU.
  virtual double flops_per_token(int64_t T) const;
  // Figures of the last training forward to report with the step (an MoE's balance loss, say).
  virtual std::vector<std::pair<std::string, double>> step_metrics() const { return {}; }
  // For the memory estimate before the first step; std::nullopt: only the parameters are counted.
  virtual std::optional<TransformerShape> transformer_shape() const { return std::nullopt; }

  // Weights under the file names of the adapter, and back (what names the source in errors).
  std::vector<std::pair<std::string, Tensor>> state_dict();
  void load_state_dict(const std::vector<std::pair<std::string, Tensor>>& sd, const std::string& what);
  virtual const StateDictAdapter& state_dict_adapter() const;
  // Saved with the weights; includes "atoll_family" so that model_from_metadata finds the family.
  virtual std::map<std::string, std::string> config_metadata() const;

  // Activation recomputation per block ([train] recompute, nn/recompute.h): run_blocks wraps a
  // "full" block in a checkpoint; a family that can recompute less ("selective") overrides this to
  // tell its blocks. Missing entries are none.
  virtual void set_recompute(std::vector<Recompute> per_block) { recompute_ = std::move(per_block); }
  Recompute recompute(size_t block) const { return block < recompute_.size() ? recompute_[block] : Recompute::none; }

  // nullptr (the default) removes them; the hooks must outlive their use.
  void set_block_hooks(BlockHooks* h) { hooks_ = h; }
  BlockHooks* block_hooks() const { return hooks_; }

 protected:
  explicit Model(std::string prefix = "") : Module(std::move(prefix)) {}
  // The forward's start (calls the hooks' forward_begin).
  void begin_forward() const;
  // Runs x through blocks 0..n-1 with `block(i, x)`, inserting the hooks' calls and markers.
  Tensor run_blocks(Tensor x, size_t n, const std::function<Tensor(size_t, const Tensor&)>& block) const;

 private:
  BlockHooks* hooks_ = nullptr;
  std::vector<Recompute> recompute_;
};

// Models over token ids (what a language-model task needs of a model).
class TokenModel {
 public:
  virtual ~TokenModel() = default;
  virtual int64_t vocab_size() const = 0;
  // The longest sequence the model takes; 0: unbounded.
  virtual int64_t max_sequence_length() const { return 0; }
};

// Models that continue a token sequence (sampling during training, `atoll sample`).
class TokenGenerator : public TokenModel {
 public:
  virtual std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t max_new_tokens, float temperature,
                                        int64_t top_k, Rng& rng) const = 0;
};

// A model family: built from a config section, or from the metadata saved with its weights.
struct ModelFamily {
  std::function<std::unique_ptr<Model>(Config& cfg, const std::string& section)> from_config;
  std::function<std::unique_ptr<Model>(const std::map<std::string, std::string>& metadata)> from_metadata;
};
Registry<ModelFamily>& model_registry();
struct ModelRegistrar {
  ModelRegistrar(const std::string& name, ModelFamily f) { model_registry().add(name, std::move(f)); }
};

// [model] family = "gpt" (the default) picks the family; the rest of the section is the family's.
std::unique_ptr<Model> make_model(Config& cfg, const std::string& section = "model");
// The family named in the metadata ("gpt" when a file has none: files written before families).
std::unique_ptr<Model> model_from_metadata(const std::map<std::string, std::string>& metadata);

}  // namespace atl::nn
