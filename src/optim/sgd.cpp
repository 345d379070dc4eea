// SGD; see sgd.h.
#include "optim/sgd.h"

#include "optim/optim_util.h"

namespace atl {

Sgd::Sgd(std::vector<ParamRef> params, SgdConfig cfg) : params_(std::move(params)), cfg_(cfg) {
  for (auto& p : params_) {
    optim::check_param(p, "sgd");
    if (cfg_.momentum > 0.f) m_.push_back(Tensor::zeros(p.value.shape()));
  }
}

void Sgd::step(const StepContext& ctx) {
  ++steps_;
  const float lr = cfg_.lr * ctx.lr_scale, mu = cfg_.momentum, gs = ctx.grad_scale;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    const float decay = 1.f - lr * (p.value.dim() >= 2 ? cfg_.weight_decay : 0.f);
    float* w = p.value.f32();
    float* m = m_.empty() ? nullptr : m_[i].f32();
    const float* g = p.grad.f32();
    const int64_t n = p.value.numel();
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t j = 0; j < n; ++j) {
      float d = gs * g[j];
      if (m) d = m[j] = mu * m[j] + d;
      w[j] = w[j] * decay - lr * d;
    }
  }
}

void Sgd::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", optim::step_tensor(steps_));
  for (size_t i = 0; i < m_.size(); ++i) out.emplace_back(prefix + params_[i].name + ".momentum_buffer", m_[i]);
}

void Sgd::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = optim::read_step(f, prefix + "step");
  for (size_t i = 0; i < m_.size(); ++i) optim::load_checked(m_[i], f, prefix + params_[i].name + ".momentum_buffer");
}

}  // namespace atl
