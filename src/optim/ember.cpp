// Ember; see ember.h.
#include "optim/ember.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "optim/optim_util.h"

namespace atl {

Ember::Ember(std::vector<ParamRef> params, EmberConfig cfg) : params_(std::move(params)), cfg_(cfg) {
  for (auto& p : params_) {
    ATOLL_CHECK(p.value.dim() == 2, "ember: parameter {} has shape {}; Ember is for 2-D [vocab, dim] tables", p.name,
                shape_str(p.value.shape()));
    optim::check_param(p, "ember");
    row_.push_back(Tensor::zeros({p.value.size(0)}));
    col_.push_back(Tensor::zeros({p.value.size(1)}));
  }
}

void Ember::step(const StepContext& ctx) {
  ++steps_;
  const float lr = cfg_.lr * ctx.lr_scale, b2 = cfg_.beta2, gs = ctx.grad_scale;
  const double bc = 1.0 - std::pow(double(b2), double(steps_));
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    const int64_t V = p.value.size(0), D = p.value.size(1);
    const float* G = p.grad.f32();
    float* r = row_[i].f32();
    float* c = col_[i].f32();
    std::vector<double> colsum(size_t(D), 0.0);
    int64_t active = 0;
    double rsum = 0;
#pragma omp parallel if (V * D > 65536)
    {
      std::vector<double> local(size_t(D), 0.0);
#pragma omp for schedule(static) reduction(+ : active, rsum)
      for (int64_t v = 0; v < V; ++v) {
        const float* g = G + v * D;
        double s = 0;
        bool any = false;
        for (int64_t j = 0; j < D; ++j) {
          double x = double(gs * g[j]);
          s += x * x;
          local[size_t(j)] += x * x;
          any |= g[j] != 0.f;
        }
        active += any;
        r[v] = b2 * r[v] + (1.f - b2) * float(s / double(D));
        rsum += r[v];
      }
#pragma omp critical
      for (int64_t j = 0; j < D; ++j) colsum[size_t(j)] += local[size_t(j)];
    }
    const double nact = cfg_.col_over_active ? double(std::max<int64_t>(active, 1)) : double(V);
    for (int64_t j = 0; j < D; ++j) c[j] = b2 * c[j] + (1.f - b2) * float(colsum[size_t(j)] / nact);
    // v_ij = (r_i / bc)(c_j / bc) / mean(r / bc) = r_i c_j / (bc * mean(r))
    const double rmean = std::max(rsum / double(V) / bc, 1e-30);
    const float decay = 1.f - lr * cfg_.weight_decay;
    float* W = p.value.f32();
#pragma omp parallel for schedule(static) if (V * D > 65536)
    for (int64_t v = 0; v < V; ++v) {
      const float ri = float(double(r[v]) / bc / rmean);
      for (int64_t j = 0; j < D; ++j) {
        float denom = std::sqrt(ri * float(double(c[j]) / bc)) + cfg_.eps;
        W[v * D + j] = W[v * D + j] * decay - lr * (gs * G[v * D + j]) / denom;
      }
    }
  }
}

void Ember::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", optim::step_tensor(steps_));
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(prefix + params_[i].name + ".row_sq", row_[i]);
    out.emplace_back(prefix + params_[i].name + ".col_sq", col_[i]);
  }
}

void Ember::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = optim::read_step(f, prefix + "step");
  for (size_t i = 0; i < params_.size(); ++i) {
    optim::load_checked(row_[i], f, prefix + params_[i].name + ".row_sq");
    optim::load_checked(col_[i], f, prefix + params_[i].name + ".col_sq");
  }
}

}  // namespace atl
