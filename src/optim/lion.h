// Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023): the sign of an
// interpolation between momentum and gradient, one state buffer:
//   u = sign(beta1 m + (1 - beta1) g);  W <- W (1 - lr wd) - lr u;  m <- beta2 m + (1 - beta2) g
// Weight decay applies to tensors of two or more dimensions only, as in atoll's AdamW.
#pragma once
#include "optim/optimizer.h"

namespace atl {

struct LionConfig {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.99f, weight_decay = 0.f;
};

class Lion : public Optimizer {
 public:
  Lion(std::vector<ParamRef> params, LionConfig cfg);
  std::string name() const override { return "lion"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;

 private:
  std::vector<ParamRef> params_;
  std::vector<Tensor> m_;
  LionConfig cfg_;
};

}  // namespace atl
