// SGD with heavy-ball momentum (PyTorch's torch.optim.SGD, dampening 0):
//   m <- mu m + g;  W <- W (1 - lr wd) - lr m
// Linear in the gradient, so averaging the parameters of replicas that each took an SGD step
// equals one step on the averaged gradient: DiLoCo with one inner step and outer SGD(lr 1) is
// DDP exactly with it (src/lowcomm/diloco.h), which no adaptive optimizer allows. Weight decay is
// decoupled (unlike torch's, which adds wd W to the gradient) and applies to tensors of two or
// more dimensions only, as in atoll's AdamW.
#pragma once
#include "optim/optimizer.h"

namespace atl {

struct SgdConfig {
  float lr = 0.1f, momentum = 0.f, weight_decay = 0.f;
};

class Sgd : public Optimizer {
 public:
  Sgd(std::vector<ParamRef> params, SgdConfig cfg);
  std::string name() const override { return "sgd"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;

 private:
  std::vector<ParamRef> params_;
  std::vector<Tensor> m_;  // empty without momentum
  SgdConfig cfg_;
};

}  // namespace atl
