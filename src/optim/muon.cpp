// Muon; see muon.h.
#include "optim/muon.h"
#include "optim/optim_util.h"

#include <vector>

namespace atl {

namespace optim {

void muon_momentum(float* M, const float* g, float* u, int64_t n, float beta, bool nesterov, float grad_scale) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) {
    float gi = grad_scale * g[i];
    float m = M[i] + (1.f - beta) * (gi - M[i]);
    M[i] = m;
    u[i] = nesterov ? gi + beta * (m - gi) : m;
  }
}

void apply_scaled_update(float* W, const float* O, int64_t n, float lr, float scale, float weight_decay) {
  const float decay = 1.f - lr * weight_decay, step = lr * scale;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) W[i] = W[i] * decay - step * O[i];
}

}  // namespace optim

Muon::Muon(std::vector<ParamRef> params, MuonConfig cfg) : params_(std::move(params)), cfg_(std::move(cfg)) {
  for (auto& p : params_) {
    ATOLL_CHECK(p.value.dim() >= 2, "muon: parameter {} has shape {}; Muon only takes matrices (route vectors to "
                "another optimizer in [optim])", p.name, shape_str(p.value.shape()));
    optim::check_param(p, "muon");
    momentum_.push_back(Tensor::zeros(p.value.shape()));
  }
}

void Muon::step(const StepContext& ctx) {
  ++steps_;
  const float lr = cfg_.lr * ctx.lr_scale;
  std::vector<float> u, o;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    auto d = optim::mat_dims(p.value);
    int64_t n = p.value.numel();
    u.resize(size_t(n));
    o.resize(size_t(n));
    optim::muon_momentum(momentum_[i].f32(), p.grad.f32(), u.data(), n, cfg_.momentum, cfg_.nesterov,
                         ctx.grad_scale);
    optim::orthogonalize(u.data(), o.data(), d.rows, d.cols, cfg_.ns);
    optim::apply_scaled_update(p.value.f32(), o.data(), n, lr, optim::update_scale(cfg_.scale, d.rows, d.cols, cfg_.layout),
                               cfg_.weight_decay);
  }
}

void Muon::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", optim::step_tensor(steps_));
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back(prefix + params_[i].name + ".momentum", momentum_[i]);
}

void Muon::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = optim::read_step(f, prefix + "step");
  for (size_t i = 0; i < params_.size(); ++i) optim::load_checked(momentum_[i], f, prefix + params_[i].name + ".momentum");
}

}  // namespace atl
