// AdamS; see adams.h.
#include "optim/adams.h"

#include <cmath>

#include "optim/optim_util.h"

namespace atl {

AdamS::AdamS(std::vector<ParamRef> params, AdamSConfig cfg) : params_(std::move(params)), cfg_(cfg) {
  for (auto& p : params_) {
    optim::check_param(p, "adams");
    m_.push_back(Tensor::zeros(p.value.shape()));
  }
}

void AdamS::step(const StepContext& ctx) {
  ++steps_;
  const float lr = cfg_.lr * ctx.lr_scale, b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps, gs = ctx.grad_scale;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    const float decay = 1.f - lr * (p.value.dim() >= 2 ? cfg_.weight_decay : 0.f);
    float* w = p.value.f32();
    float* m = m_[i].f32();
    const float* g = p.grad.f32();
    const int64_t n = p.value.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t j = 0; j < n; ++j) {
      float gj = gs * g[j];
      float v = b2 * m[j] * m[j] + (1.f - b2) * gj * gj;
      float mj = b1 * m[j] + (1.f - b1) * gj;
      m[j] = mj;
      w[j] = w[j] * decay - lr * mj / (std::sqrt(v) + eps);
    }
  }
}

void AdamS::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", optim::step_tensor(steps_));
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back(prefix + params_[i].name + ".exp_avg", m_[i]);
}

void AdamS::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = optim::read_step(f, prefix + "step");
  for (size_t i = 0; i < params_.size(); ++i) optim::load_checked(m_[i], f, prefix + params_[i].name + ".exp_avg");
}

}  // namespace atl
