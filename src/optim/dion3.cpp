// Dion3; see dion3.h.
#include "optim/dion3.h"
#include "optim/optim_util.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "optim/muon.h"

namespace atl {

namespace dion3 {

bool selects_rows(const Dion3Config& cfg, const optim::MatDims& d) {
  const auto& s = cfg.select;
  return s == "rows" || (s == "neurons" && cfg.layout == optim::Layout::out_in) || (s == "shorter" && d.rows <= d.cols);
}

int64_t count(float fraction, int64_t n) {
  return n == 0 ? 0 : std::max<int64_t>(1, int64_t(std::ceil(double(fraction) * double(n))));
}

std::vector<int64_t> top_k(const float* norms, int64_t n, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
    return norms[a] != norms[b] ? norms[a] > norms[b] : a < b;
  });
  idx.resize(size_t(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

float normuon_normalize(float* O, int64_t k, int64_t len, const int64_t* slices, float* V, float beta2) {
  double fro_before = optim::sum_sq(O, k * len);
  for (int64_t s = 0; s < k; ++s) {
    float* row = O + s * len;
    double ms = 0;
    for (int64_t j = 0; j < len; ++j) ms += double(row[j]) * row[j];
    float mean_sq = float(ms / double(len));
    float& v = V[slices[s]];
    v = v + (1.f - beta2) * (mean_sq - v);
    float inv = 1.f / (std::sqrt(v) + 1e-8f);
    for (int64_t j = 0; j < len; ++j) row[j] *= inv;
  }
  double fro_after = std::max(std::sqrt(optim::sum_sq(O, k * len)), 1e-8);
  return float(std::sqrt(fro_before) / fro_after);
}

void decay(float* W, int64_t n, float lr, float weight_decay) {
  const float f = 1.f - lr * weight_decay;
  if (f == 1.f) return;
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) W[i] *= f;
}

}  // namespace dion3

Dion3::Dion3(std::vector<ParamRef> params, Dion3Config cfg) : params_(std::move(params)), cfg_(std::move(cfg)) {
  ATOLL_CHECK(cfg_.fraction > 0.f && cfg_.fraction <= 1.f, "dion3: fraction must be in (0, 1], got {}",
              cfg_.fraction);
  const auto& s = cfg_.select;
  ATOLL_CHECK(s == "rows" || s == "cols" || s == "neurons" || s == "shorter",
              "dion3: select must be rows, cols, neurons or shorter, got '{}'", s);
  for (auto& p : params_) {
    ATOLL_CHECK(p.value.dim() >= 2, "dion3: parameter {} has shape {}; it only takes matrices", p.name,
                shape_str(p.value.shape()));
    optim::check_param(p, "dion3");
    auto d = optim::mat_dims(p.value);
    bool rows = dion3::selects_rows(cfg_, d);
    select_rows_.push_back(rows);
    momentum_.push_back(Tensor::zeros(p.value.shape()));
    variance_.push_back(Tensor::zeros({rows ? d.rows : d.cols}));
  }
}

void Dion3::step(const StepContext& ctx) {
  ++steps_;
  const float lr = cfg_.lr * ctx.lr_scale;
  std::vector<float> norms, U, O;
  std::vector<int64_t> idx;
  for (size_t pi = 0; pi < params_.size(); ++pi) {
    auto& p = params_[pi];
    auto d = optim::mat_dims(p.value);
    const bool by_rows = select_rows_[pi];
    const int64_t nslice = by_rows ? d.rows : d.cols, len = by_rows ? d.cols : d.rows;
    // Element (s, j) of slice s: M[s, j] for rows, M[j, s] for columns.
    auto at = [&](int64_t s, int64_t j) { return by_rows ? s * d.cols + j : j * d.cols + s; };
    float* M = momentum_[pi].f32();
    const float* G = p.grad.f32();
    const int64_t n = p.value.numel();
    const float gs = ctx.grad_scale;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) M[i] += gs * G[i];

    norms.assign(size_t(nslice), 0.f);
    for (int64_t r = 0; r < d.rows; ++r)
      for (int64_t c = 0; c < d.cols; ++c) norms[size_t(by_rows ? r : c)] += std::fabs(M[r * d.cols + c]);
    const int64_t k = dion3::count(cfg_.fraction, nslice);
    idx = dion3::top_k(norms.data(), nslice, k);

    // Gather the selected slices as the rows of U [k, len], and decay them in M.
    U.resize(size_t(k * len));
    O.resize(size_t(k * len));
    for (int64_t s = 0; s < k; ++s)
      for (int64_t j = 0; j < len; ++j) {
        float& m = M[at(idx[size_t(s)], j)];
        U[size_t(s * len + j)] = m;
        m *= cfg_.mu;
      }
    optim::orthogonalize(U.data(), O.data(), k, len, cfg_.ns);

    const float renorm = dion3::normuon_normalize(O.data(), k, len, idx.data(), variance_[pi].f32(), cfg_.beta2);

    // Weight decay on the whole matrix, the update on the selected slices only.
    float* W = p.value.f32();
    dion3::decay(W, n, lr, cfg_.weight_decay);
    const float step = lr * optim::update_scale(cfg_.scale, d.rows, d.cols, cfg_.layout) * renorm;
    for (int64_t s = 0; s < k; ++s)
      for (int64_t j = 0; j < len; ++j) W[at(idx[size_t(s)], j)] -= step * O[size_t(s * len + j)];
  }
}

void Dion3::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", optim::step_tensor(steps_));
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(prefix + params_[i].name + ".momentum", momentum_[i]);
    out.emplace_back(prefix + params_[i].name + ".variance", variance_[i]);
  }
}

void Dion3::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = optim::read_step(f, prefix + "step");
  for (size_t i = 0; i < params_.size(); ++i) {
    optim::load_checked(momentum_[i], f, prefix + params_[i].name + ".momentum");
    optim::load_checked(variance_[i], f, prefix + params_[i].name + ".variance");
  }
}

}  // namespace atl
