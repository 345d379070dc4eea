// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter, "Decoupled Weight Decay
// Regularization", 2019). Weight decay applies to parameters of two or more dimensions only
// (matrices and embeddings), not to gains and biases, as in GPT-2 training recipes.
#pragma once
#include <memory>

#include "optim/optimizer.h"
#include "optim/state_file.h"

namespace atl {

struct AdamWConfig {
  float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  // Non-empty: the moments live in a memory-mapped file under this directory and the step
  // streams over them, stream_chunk elements at a time (optim/state_file.h); the results are
  // bit-identical to resident state (the update is elementwise, chunks are multiples of 64).
  std::string offload_dir = "";
  int64_t stream_chunk = int64_t(1) << 18;
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParamRef> params, AdamWConfig cfg);
  std::string name() const override { return "adamw"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;
  const AdamWConfig& config() const { return cfg_; }

 private:
  std::vector<ParamRef> params_;
  std::vector<Tensor> m_, v_;
  AdamWConfig cfg_;
  std::unique_ptr<StateFile> file_;  // offloaded moments (null: resident)
  std::vector<int64_t> off_;         // per parameter: m's offset in file_ (v follows)
};

std::unique_ptr<Optimizer> make_adamw(std::vector<ParamRef> params, float lr, float beta1, float beta2, float eps,
                                      float weight_decay);

}  // namespace atl
