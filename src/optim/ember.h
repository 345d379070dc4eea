// Ember ("Token Geometry"; github.com/katop1234/ember): an optimizer for embedding and LM-head
// tables E [V, D] with O(V + D) state and no first moment. Adafactor-style factored second moment:
//   r_i <- lerp(r_i, mean_j G_ij^2, 1 - beta2)                 (all V rows; absent rows decay)
//   c_j <- lerp(c_j, sum_i G_ij^2 / V, 1 - beta2)
//   v_ij = r^_i c^_j / mean(r^)  with r^, c^ bias-corrected by 1 - beta2^t
// mean(r) is the reference's scalar s (the EMA of mean G^2 over the table), so c / mean(r) is a
// column profile of mean 1 whatever the number of rows with a gradient. col_mean = "active"
// (col_over_active) divides c by the rows that got a gradient instead, as atoll did before round 2:
// with mean(r) still over all V rows that inflates v by V / #active and shrinks sparse tables'
// steps by sqrt(#active / V); kept only to reproduce older runs.
//   E <- E (1 - lr wd) - lr G / (sqrt(v) + eps)
#pragma once
#include "optim/optimizer.h"

namespace atl {

struct EmberConfig {
  float lr = 1e-3f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  bool col_over_active = false;  // col_mean = "active"
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
