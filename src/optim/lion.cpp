// Lion; see lion.h.
#include "optim/lion.h"

#include "optim/optim_util.h"

namespace atl {

Lion::Lion(std::vector<ParamRef> params, LionConfig cfg) : params_(std::move(params)), cfg_(cfg) {
  for (auto& p : params_) {
    optim::check_param(p, "lion");
    m_.push_back(Tensor::zeros(p.value.shape()));
  }
}

void Lion::step(const StepContext& ctx) {
  ++steps_;
  const float lr = cfg_.lr * ctx.lr_scale, b1 = cfg_.beta1, b2 = cfg_.beta2, gs = ctx.grad_scale;
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
      float c = b1 * m[j] + (1.f - b1) * gj;
      float u = c > 0.f ? 1.f : (c < 0.f ? -1.f : 0.f);
      w[j] = w[j] * decay - lr * u;
      m[j] = b2 * m[j] + (1.f - b2) * gj;
    }
  }
}

void Lion::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", optim::step_tensor(steps_));
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back(prefix + params_[i].name + ".exp_avg", m_[i]);
}

void Lion::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = optim::read_step(f, prefix + "step");
  for (size_t i = 0; i < params_.size(); ++i) optim::load_checked(m_[i], f, prefix + params_[i].name + ".exp_avg");
}

}  // namespace atl
