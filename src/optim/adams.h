// AdamS (Zhang, Wang & Chen, "AdamS: Momentum Itself Can Be A Normalizer for LLM Pretraining and
// Post-training", 2025; the optimizer under SCAPE's sparse communication): Adam's denominator
// rebuilt from the momentum instead of a second-moment buffer, so the state is SGD-momentum sized:
//   v = beta2 m_{t-1}^2 + (1 - beta2) g^2;   m <- beta1 m + (1 - beta1) g
//   W <- W (1 - lr wd) - lr m / (sqrt(v) + eps)
// Weight decay applies to tensors of two or more dimensions only, as in atoll's AdamW.
#pragma once
#include "optim/optimizer.h"

namespace atl {

struct AdamSConfig {
  float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.f;
};

class AdamS : public Optimizer {
 public:
  AdamS(std::vector<ParamRef> params, AdamSConfig cfg);
  std::string name() const override { return "adams"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;
  const AdamSConfig& config() const { return cfg_; }

 private:
  std::vector<ParamRef> params_;
  std::vector<Tensor> m_;
  AdamSConfig cfg_;
};

}  // namespace atl
