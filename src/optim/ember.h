// Ember ("Token Geometry"; github.com/katop1234/ember): an optimizer for embedding and LM-head
// tables E [V, D] with O(V + D) state and no first moment. Adafactor-style factored second
// moment, with the column statistic averaged over the rows that received a gradient this step
// (a token absent from the batch would otherwise pull every column towards zero):
//   r_i <- lerp(r_i, mean_j G_ij^2, 1 - beta2)                 (all V rows; absent rows decay)
//   c_j <- lerp(c_j, sum_i G_ij^2 / #active rows, 1 - beta2)
//   v_ij = r^_i c^_j / mean(r^)  with r^, c^ bias-corrected by 1 - beta2^t
//   E <- E (1 - lr wd) - lr G / (sqrt(v) + eps)
#pragma once
#include "optim/optimizer.h"

namespace atl {

struct EmberConfig {
  float lr = 1e-3f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
};

class Ember : public Optimizer {
 public:
  Ember(std::vector<ParamRef> params, EmberConfig cfg);
  std::string name() const override { return "ember"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;

 private:
  std::vector<ParamRef> params_;
  std::vector<Tensor> row_, col_;
  EmberConfig cfg_;
};

}  // namespace atl
