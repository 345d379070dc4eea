// Periodic Row-wise Muon; see periodic_row_muon.h.
#include "optim/periodic_row_muon.h"
#include "optim/optim_util.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace atl {

namespace optim {

void normalize_slices(float* u, int64_t rows, int64_t cols, bool rows_axis, float eps, float gain) {
  if (rows_axis) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t i = 0; i < rows; ++i) {
      float* r = u + i * cols;
      double s = 0;
      for (int64_t j = 0; j < cols; ++j) s += double(r[j]) * r[j];
      float f = gain / (float(std::sqrt(s)) + eps);
      for (int64_t j = 0; j < cols; ++j) r[j] *= f;
    }
  } else {
    std::vector<double> s(size_t(cols), 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) s[size_t(j)] += double(u[i * cols + j]) * u[i * cols + j];
    std::vector<float> f(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j) f[size_t(j)] = gain / (float(std::sqrt(s[size_t(j)])) + eps);
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) u[i * cols + j] *= f[size_t(j)];
  }
}

std::pair<double, double> row_fit_parts(const float* o, const float* u, int64_t rows, int64_t cols, bool rows_axis,
                                        float eps, const double* norms) {
  std::vector<double> own;
  if (!norms) {
    own.assign(static_cast<size_t>(rows_axis ? rows : cols), 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) own[size_t(rows_axis ? i : j)] += double(u[i * cols + j]) * u[i * cols + j];
    for (double& v : own) v = std::sqrt(v);
    norms = own.data();
  }
  double orr = 0, rr = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double r = double(u[i * cols + j]) / (double(float(norms[rows_axis ? i : j])) + eps);
      orr += double(o[i * cols + j]) * r;
      rr += r * r;
    }
  return {orr, rr};
}

}  // namespace optim

PeriodicRowMuon::PeriodicRowMuon(std::vector<ParamRef> params, PeriodicRowMuonConfig cfg)
    : params_(std::move(params)), cfg_(std::move(cfg)) {
  ATOLL_CHECK(cfg_.period >= 1, "prmuon: period K must be at least 1, got {}", cfg_.period);
  for (auto& p : params_) {
    ATOLL_CHECK(p.value.dim() >= 2, "prmuon: parameter {} has shape {}; it only takes matrices", p.name,
                shape_str(p.value.shape()));
    optim::check_param(p, "prmuon");
    momentum_.push_back(Tensor::zeros(p.value.shape()));
  }
  fit_.assign(params_.size(), 1.f);
}

void PeriodicRowMuon::step(const StepContext& ctx) {
  ++steps_;
  const auto& mc = cfg_.muon;
  const float lr = mc.lr * ctx.lr_scale;
  const bool refresh = is_refresh(steps_);
  std::vector<float> u, o;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    auto d = optim::mat_dims(p.value);
    int64_t n = p.value.numel();
    u.resize(size_t(n));
    optim::muon_momentum(momentum_[i].f32(), p.grad.f32(), u.data(), n, mc.momentum, mc.nesterov, ctx.grad_scale);
    float scale = optim::update_scale(mc.scale, d.rows, d.cols, mc.layout);
    if (refresh) {
      o.resize(size_t(n));
      optim::orthogonalize(u.data(), o.data(), d.rows, d.cols, mc.ns);
      if (cfg_.fit_scale)
        fit_[i] = optim::row_fit(optim::row_fit_parts(o.data(), u.data(), d.rows, d.cols, cfg_.normalize_rows, cfg_.eps));
      optim::apply_scaled_update(p.value.f32(), o.data(), n, lr, scale, mc.weight_decay);
    } else {
      int64_t len = cfg_.normalize_rows ? d.rows : d.cols;
      float gain = cfg_.fit_scale ? fit_[i] : float(std::sqrt(double(std::min(d.rows, d.cols)) / double(len)));
      optim::normalize_slices(u.data(), d.rows, d.cols, cfg_.normalize_rows, cfg_.eps, gain);
      optim::apply_scaled_update(p.value.f32(), u.data(), n, lr, scale, mc.weight_decay);
    }
  }
}

void PeriodicRowMuon::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", optim::step_tensor(steps_));
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back(prefix + params_[i].name + ".momentum", momentum_[i]);
  if (cfg_.fit_scale)
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor c = Tensor::empty({1});
      c.f32()[0] = fit_[i];
      out.emplace_back(prefix + params_[i].name + ".row_fit", c);
    }
}

void PeriodicRowMuon::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = optim::read_step(f, prefix + "step");
  for (size_t i = 0; i < params_.size(); ++i) optim::load_checked(momentum_[i], f, prefix + params_[i].name + ".momentum");
  if (cfg_.fit_scale)
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor c = Tensor::empty({1});
      optim::load_checked(c, f, prefix + params_[i].name + ".row_fit");
      fit_[i] = c.f32()[0];
    }
}

}  // namespace atl
