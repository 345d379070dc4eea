// SOAP; see soap.h.
#include "optim/soap.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "optim/linalg.h"
#include "optim/optim_util.h"

namespace atl {

Soap::Soap(std::vector<ParamRef> params, SoapConfig cfg) : params_(std::move(params)), cfg_(cfg) {
  ATOLL_CHECK(cfg_.precondition_frequency >= 1, "soap: precondition_frequency must be at least 1");
  ATOLL_CHECK(cfg_.update_rms >= 0.f, "soap: update_rms must be >= 0 (0: off), got {}", cfg_.update_rms);
  for (auto& p : params_) {
    ATOLL_CHECK(p.value.dim() >= 2, "soap: parameter {} has shape {}; SOAP here takes matrices (route vectors to "
                "adamw)", p.name, shape_str(p.value.shape()));
    optim::check_param(p, "soap");
    auto d = optim::mat_dims(p.value);
    State s;
    s.m = Tensor::zeros(p.value.shape());
    s.v = Tensor::zeros(p.value.shape());
    if (d.rows <= cfg_.max_precond_dim) {
      s.L = Tensor::zeros({d.rows, d.rows});
      s.QL = Tensor::zeros({d.rows, d.rows});
      if (cfg_.kl_factors) s.lL = Tensor::zeros({d.rows});
    }
    if (d.cols <= cfg_.max_precond_dim) {
      s.R = Tensor::zeros({d.cols, d.cols});
      s.QR = Tensor::zeros({d.cols, d.cols});
      if (cfg_.kl_factors) s.lR = Tensor::zeros({d.cols});
    }
    st_.push_back(std::move(s));
  }
}

// out = QL^T in QR (back = false) or QL in QR^T (back = true); identity for a missing side.
void Soap::project(size_t i, const float* in, float* out, bool back) {
  auto d = optim::mat_dims(params_[i].value);
  auto& s = st_[i];
  const int64_t m = d.rows, n = d.cols;
  std::vector<float> t(size_t(m * n));
  if (s.QL.defined())
    cpu::gemm(!back, false, m, n, m, 1.f, s.QL.f32(), m, in, n, 0.f, t.data(), n);
  else
    std::copy(in, in + m * n, t.begin());
  if (s.QR.defined())
    cpu::gemm(false, back, m, n, n, 1.f, t.data(), n, s.QR.f32(), n, 0.f, out, n);
  else
    std::copy(t.begin(), t.end(), out);
}

void Soap::update_preconditioner(size_t i, const float* g, bool refresh) {
  auto d = optim::mat_dims(params_[i].value);
  auto& s = st_[i];
  const int64_t m = d.rows, n = d.cols;
  float sb = cfg_.shampoo_beta < 0 ? cfg_.beta2 : cfg_.shampoo_beta;
  if (cfg_.correct_shampoo_bias) sb = float(1.0 - (1.0 - double(sb)) / (1.0 - std::pow(double(sb), double(steps_))));
  const bool first = steps_ == 1;
  // Both increments from the old bases and eigenvalues, then both factors move.
  std::vector<float> inc[2];
  for (int side = 0; side < 2; ++side) {
    Tensor& F = side == 0 ? s.L : s.R;
    if (!F.defined()) continue;
    const int64_t k = side == 0 ? m : n;
    inc[side].assign(size_t(k * k), 0.f);
    if (!cfg_.kl_factors) {  // G G^T or G^T G
      if (side == 0)
        cpu::gemm(false, true, k, k, n, 1.f, g, n, g, n, 0.f, inc[side].data(), k);
      else
        cpu::gemm(true, false, k, k, m, 1.f, g, n, g, n, 0.f, inc[side].data(), k);
      continue;
    }
    // KL-Shampoo: the other side's inverse factor estimate C = Q diag(1/l) Q^T (identity on the first
    // step, before any basis, or for an unpreconditioned other side), divided by its dimension.
    const Tensor& Qo = side == 0 ? s.QR : s.QL;
    const Tensor& lo = side == 0 ? s.lR : s.lL;
    const int64_t ko = side == 0 ? n : m;
    std::vector<float> C(size_t(ko * ko), 0.f);
    if (first || !Qo.defined()) {
      for (int64_t r = 0; r < ko; ++r) C[size_t(r * ko + r)] = 1.f;
    } else {
      std::vector<float> Qs(size_t(ko * ko));
      const float* q = Qo.f32();
      for (int64_t r = 0; r < ko; ++r)
        for (int64_t c = 0; c < ko; ++c) Qs[size_t(r * ko + c)] = q[r * ko + c] / std::max(lo.f32()[c], cfg_.eps);
      cpu::gemm(false, true, ko, ko, ko, 1.f, Qs.data(), ko, q, ko, 0.f, C.data(), ko);
    }
    std::vector<float> T(size_t(m * n));
    if (side == 0) {  // (G C_R) G^T / n
      cpu::gemm(false, false, m, n, n, 1.f, g, n, C.data(), n, 0.f, T.data(), n);
      cpu::gemm(false, true, m, m, n, 1.f / float(n), T.data(), n, g, n, 0.f, inc[side].data(), m);
    } else {  // G^T (C_L G) / m
      cpu::gemm(false, false, m, n, m, 1.f, C.data(), m, g, n, 0.f, T.data(), n);
      cpu::gemm(true, false, n, n, m, 1.f / float(m), g, n, T.data(), n, 0.f, inc[side].data(), n);
    }
  }
  for (int side = 0; side < 2; ++side) {
    Tensor& F = side == 0 ? s.L : s.R;
    Tensor& Q = side == 0 ? s.QL : s.QR;
    Tensor& lam = side == 0 ? s.lL : s.lR;
    if (!F.defined()) continue;
    const int64_t k = side == 0 ? m : n;
    float* f = F.f32();
    for (int64_t j = 0; j < k * k; ++j) f[j] = sb * f[j] + (1.f - sb) * inc[side][size_t(j)];
    if (first) {
      std::vector<float> A(F.f32(), F.f32() + k * k), w(static_cast<size_t>(k));
      optim::eigh_sym(A.data(), w.data(), k);
      // Descending eigenvalues: reverse the column order.
      float* q = Q.f32();
      for (int64_t r = 0; r < k; ++r)
        for (int64_t c = 0; c < k; ++c) q[r * k + c] = A[size_t(r * k + (k - 1 - c))];
      if (lam.defined())
        for (int64_t c = 0; c < k; ++c) lam.f32()[c] = w[size_t(k - 1 - c)];
    } else if (refresh) {
      // Sort the basis by the estimated eigenvalues diag(Q^T F Q), permuting V to match.
      std::vector<float> FQ(size_t(k * k));
      cpu::gemm(false, false, k, k, k, 1.f, F.f32(), k, Q.f32(), k, 0.f, FQ.data(), k);
      std::vector<double> est(size_t(k), 0.0);
      const float* q = Q.f32();
      for (int64_t r = 0; r < k; ++r)
        for (int64_t c = 0; c < k; ++c) est[size_t(c)] += double(q[r * k + c]) * FQ[size_t(r * k + c)];
      std::vector<int64_t> order(static_cast<size_t>(k));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return est[size_t(a)] > est[size_t(b)]; });
      std::vector<float> Qs(size_t(k * k));
      for (int64_t r = 0; r < k; ++r)
        for (int64_t c = 0; c < k; ++c) Qs[size_t(r * k + c)] = q[r * k + order[size_t(c)]];
      if (lam.defined())
        for (int64_t c = 0; c < k; ++c) lam.f32()[c] = float(est[size_t(order[size_t(c)])]);
      Tensor vnew = Tensor::empty(s.v.shape());
      const float* vo = s.v.f32();
      float* vn = vnew.f32();
      for (int64_t r = 0; r < d.rows; ++r)
        for (int64_t c = 0; c < d.cols; ++c)
          vn[r * d.cols + c] = side == 0 ? vo[order[size_t(r)] * d.cols + c] : vo[r * d.cols + order[size_t(c)]];
      s.v = vnew;
      // One power iteration, then re-orthonormalize.
      cpu::gemm(false, false, k, k, k, 1.f, F.f32(), k, Qs.data(), k, 0.f, Q.f32(), k);
      optim::qr_q(Q.f32(), k, k);
    }
  }
}

void Soap::step(const StepContext& ctx) {
  ++steps_;
  const float lr = cfg_.lr * ctx.lr_scale;
  const int64_t t = steps_ - 1;  // Adam steps taken, this one included
  std::vector<float> g, gp, mp;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    auto& s = st_[i];
    const int64_t n = p.value.numel();
    g.resize(size_t(n));
    optim::scale_into(g.data(), p.grad.f32(), ctx.grad_scale, n);
    if (t == 0) {
      update_preconditioner(i, g.data(), false);
      continue;
    }
    gp.resize(size_t(n));
    mp.resize(size_t(n));
    project(i, g.data(), gp.data(), false);
    float* m = s.m.f32();
    float* v = s.v.f32();
    for (int64_t j = 0; j < n; ++j) {
      m[j] = cfg_.beta1 * m[j] + (1.f - cfg_.beta1) * g[size_t(j)];
      v[j] = cfg_.beta2 * v[j] + (1.f - cfg_.beta2) * gp[size_t(j)] * gp[size_t(j)];
    }
    project(i, m, mp.data(), false);
    for (int64_t j = 0; j < n; ++j) mp[size_t(j)] /= std::sqrt(v[j]) + cfg_.eps;
    project(i, mp.data(), gp.data(), true);
    const double bc1 = 1.0 - std::pow(double(cfg_.beta1), double(t));
    const double bc2 = 1.0 - std::pow(double(cfg_.beta2), double(t));
    float step = float(lr * std::sqrt(bc2) / bc1);
    if (cfg_.update_rms > 0.f) {  // RMS matching: the bias correction, a scalar, cancels
      const double rms = std::sqrt(optim::sum_sq(gp.data(), n) / double(n));
      step = float(double(lr) * double(cfg_.update_rms) / std::max(rms, 1e-30));
    }
    const float decay = 1.f - lr * cfg_.weight_decay;
    float* w = p.value.f32();
    for (int64_t j = 0; j < n; ++j) w[j] = (w[j] - step * gp[size_t(j)]) * decay;
    update_preconditioner(i, g.data(), t % cfg_.precondition_frequency == 0);
  }
}

void Soap::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", optim::step_tensor(steps_));
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& s = st_[i];
    const std::string b = prefix + params_[i].name;
    out.emplace_back(b + ".exp_avg", s.m);
    out.emplace_back(b + ".exp_avg_sq", s.v);
    if (s.L.defined()) {
      out.emplace_back(b + ".GG_left", s.L);
      out.emplace_back(b + ".Q_left", s.QL);
      if (s.lL.defined()) out.emplace_back(b + ".eig_left", s.lL);
    }
    if (s.R.defined()) {
      out.emplace_back(b + ".GG_right", s.R);
      out.emplace_back(b + ".Q_right", s.QR);
      if (s.lR.defined()) out.emplace_back(b + ".eig_right", s.lR);
    }
  }
}

void Soap::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = optim::read_step(f, prefix + "step");
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& s = st_[i];
    const std::string b = prefix + params_[i].name;
    optim::load_checked(s.m, f, b + ".exp_avg");
    optim::load_checked(s.v, f, b + ".exp_avg_sq");
    if (s.L.defined()) {
      optim::load_checked(s.L, f, b + ".GG_left");
      optim::load_checked(s.QL, f, b + ".Q_left");
      if (s.lL.defined()) optim::load_checked(s.lL, f, b + ".eig_left");
    }
    if (s.R.defined()) {
      optim::load_checked(s.R, f, b + ".GG_right");
      optim::load_checked(s.QR, f, b + ".Q_right");
      if (s.lR.defined()) optim::load_checked(s.lR, f, b + ".eig_right");
    }
  }
}

}  // namespace atl
