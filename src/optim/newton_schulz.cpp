// Newton-Schulz orthogonalization, plain and Gram forms; see newton_schulz.h for the sources.
#include "optim/newton_schulz.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/config.h"
#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "optim/optim_util.h"
#include "tensor/dtype.h"

namespace atl::optim {

NsSchedule parse_ns_schedule(const std::string& s) {
  if (s == "quintic") return NsSchedule::quintic;
  if (s == "polar_express") return NsSchedule::polar_express;
  fail("unknown Newton-Schulz schedule '{}': use \"quintic\" or \"polar_express\"", s);
}

NsPrecision parse_ns_precision(const std::string& s) {
  if (s == "f32") return NsPrecision::f32;
  if (s == "bf16") return NsPrecision::bf16;
  fail("unknown Newton-Schulz precision '{}': use \"f32\" or \"bf16\"", s);
}

NsOptions ns_options_from_config(Config& cfg, const std::string& sec, const NsOptions& d) {
  NsOptions o = d;
  o.schedule = parse_ns_schedule(cfg.get_string(sec + ".ns_schedule", d.schedule == NsSchedule::quintic
                                                                          ? "quintic"
                                                                          : "polar_express",
                                                {"quintic", "polar_express"}));
  o.steps = int(cfg.get_int(sec + ".ns_steps", d.steps, 1, 100));
  o.precision = parse_ns_precision(
      cfg.get_string(sec + ".ns_precision", d.precision == NsPrecision::f32 ? "f32" : "bf16", {"f32", "bf16"}));
  o.gram = cfg.get_bool(sec + ".ns_gram", d.gram);
  o.gram_min_aspect = float(cfg.get_float(sec + ".ns_gram_min_aspect", 2.0, 0.0, 1e6));
  std::vector<int64_t> def(d.gram_restarts.begin(), d.gram_restarts.end());
  auto r = cfg.get_int_list(sec + ".ns_gram_restarts", def);
  o.gram_restarts.assign(r.begin(), r.end());
  return o;
}

std::vector<std::array<float, 3>> ns_coefficients(NsSchedule s, int steps) {
  std::vector<std::array<float, 3>> out;
  if (s == NsSchedule::quintic) {
    out.assign(size_t(steps), {3.4445f, -4.7750f, 2.0315f});
    return out;
  }
  // Polar Express, degree 5, designed for an initial lower bound of 1e-3 on the normalized
  // spectrum; the last triple repeats. All but the last are divided by (1.01, 1.01^3, 1.01^5) so
  // that round-off cannot push a singular value past the polynomial's stable interval.
  static const double pe[8][3] = {
      {8.28721201814563, -23.595886519098837, 17.300387312530933},
      {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
      {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
      {3.3184196573706015, -2.488488024314874, 0.51004894012372},
      {2.300652019954817, -1.6689039845747493, 0.4188073119525673},
      {1.891301407787398, -1.2679958271945868, 0.37680408948524835},
      {1.8750014808534479, -1.2500016453999487, 0.3750001645474248},
      {1.875, -1.25, 0.375},
  };
  for (int i = 0; i < steps; ++i) {
    int k = std::min(i, 7);
    double sa = k < 7 ? 1.01 : 1.0;
    out.push_back({float(pe[k][0] / sa), float(pe[k][1] / (sa * sa * sa)), float(pe[k][2] / std::pow(sa, 5))});
  }
  return out;
}

namespace {

inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

// C = alpha op(A) op(B) + beta C. In bf16 mode the operands (already rounded to bf16 values) go
// through cpu::gemm_bf16: exact conversion, bf16 x bf16 products, fp32 accumulation.
void matmul(bool bf, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
        const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (!bf) {
    cpu::gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  const int64_t na = (ta ? K : M) * lda, nb = (tb ? N : K) * ldb;
  std::vector<bf16> a(static_cast<size_t>(na)), b(static_cast<size_t>(nb));
  cpu::f32_to_bf16(A, a.data(), na);
  cpu::f32_to_bf16(B, b.data(), nb);
  cpu::gemm_bf16(ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, C, ldc);
}

void maybe_round(std::vector<float>& v, bool bf) {
  if (!bf) return;
  int64_t n = int64_t(v.size());
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = round_bf16(v[size_t(i)]);
}

// X [m, n] wide (m <= n), already normalized. Plain iteration.
void ns_plain(std::vector<float>& X, int64_t m, int64_t n, const std::vector<std::array<float, 3>>& coef, bool bf) {
  std::vector<float> A(size_t(m * m)), B(size_t(m * m)), Xn(X.size());
  for (const auto& [a, b, c] : coef) {
    maybe_round(X, bf);
    matmul(bf, false, true, m, m, n, 1.f, X.data(), n, X.data(), n, 0.f, A.data(), m);
    maybe_round(A, bf);
    for (size_t i = 0; i < A.size(); ++i) B[i] = b * A[i];
    matmul(bf, false, false, m, m, m, c, A.data(), m, A.data(), m, 1.f, B.data(), m);
    maybe_round(B, bf);
    scale_into(Xn.data(), X.data(), a, int64_t(X.size()));
    matmul(bf, false, false, m, n, m, 1.f, B.data(), m, X.data(), n, 1.f, Xn.data(), n);
    std::swap(X, Xn);
  }
  maybe_round(X, bf);
}

// Gram form: every iterate is Q(R) X0 with Q a polynomial in R = X0 X0^T, so all the m x m
// factors commute and the order of the products below does not matter mathematically.
void ns_gram(std::vector<float>& X, int64_t m, int64_t n, const std::vector<std::array<float, 3>>& coef, bool bf,
             const std::vector<int>& restarts) {
  auto is_restart = [&](int i) { return std::find(restarts.begin(), restarts.end(), i) != restarts.end(); };
  const size_t mm = size_t(m * m);
  std::vector<float> R(mm), Z(mm), Q(mm), T(mm), RZ(mm), Xn(X.size());
  bool have_q = false;
  maybe_round(X, bf);
  matmul(bf, false, true, m, m, n, 1.f, X.data(), n, X.data(), n, 0.f, R.data(), m);
  maybe_round(R, bf);
  const int steps = int(coef.size());
  for (int it = 0; it < steps; ++it) {
    const auto [a, b, c] = coef[size_t(it)];
    if (it != 0 && is_restart(it)) {
      // Re-form X = Q X and its Gram matrix from scratch.
      matmul(bf, false, false, m, n, m, 1.f, Q.data(), m, X.data(), n, 0.f, Xn.data(), n);
      std::swap(X, Xn);
      maybe_round(X, bf);
      matmul(bf, false, true, m, m, n, 1.f, X.data(), n, X.data(), n, 0.f, R.data(), m);
      maybe_round(R, bf);
      have_q = false;
    }
    // Z = b R + c R^2
    for (size_t i = 0; i < mm; ++i) Z[i] = b * R[i];
    matmul(bf, false, false, m, m, m, c, R.data(), m, R.data(), m, 1.f, Z.data(), m);
    maybe_round(Z, bf);
    if (!have_q) {
      Q = Z;
      for (int64_t i = 0; i < m; ++i) Q[size_t(i * m + i)] += a;
      have_q = true;
    } else {
      // Q <- Q (a I + Z) = a Q + Q Z
      scale_into(T.data(), Q.data(), a, int64_t(mm));
      matmul(bf, false, false, m, m, m, 1.f, Q.data(), m, Z.data(), m, 1.f, T.data(), m);
      std::swap(Q, T);
    }
    maybe_round(Q, bf);
    if (it < steps - 1 && !is_restart(it + 1)) {
      // R <- (a I + Z) R (a I + Z): RZ = a R + R Z, then R = a RZ + Z RZ.
      scale_into(RZ.data(), R.data(), a, int64_t(mm));
      matmul(bf, false, false, m, m, m, 1.f, R.data(), m, Z.data(), m, 1.f, RZ.data(), m);
      maybe_round(RZ, bf);
      scale_into(R.data(), RZ.data(), a, int64_t(mm));
      matmul(bf, false, false, m, m, m, 1.f, Z.data(), m, RZ.data(), m, 1.f, R.data(), m);
      maybe_round(R, bf);
    }
  }
  matmul(bf, false, false, m, n, m, 1.f, Q.data(), m, X.data(), n, 0.f, Xn.data(), n);
  std::swap(X, Xn);
  maybe_round(X, bf);
}

}  // namespace

void orthogonalize(const float* G, float* out, int64_t rows, int64_t cols, const NsOptions& opt) {
  ATOLL_CHECK(rows > 0 && cols > 0, "orthogonalize: empty {}x{} matrix", rows, cols);
  ATOLL_CHECK(opt.steps >= 1, "orthogonalize: ns_steps must be at least 1");
  const bool tall = rows > cols;
  const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
  std::vector<float> X(size_t(m * n));
  double norm = std::sqrt(sum_sq(G, rows * cols));
  double safety = opt.schedule == NsSchedule::polar_express ? 1.01 : 1.0;
  float inv = float(1.0 / (norm * safety + opt.eps));
  if (tall) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) X[size_t(j * n + i)] = inv * G[i * cols + j];
  } else {
    scale_into(X.data(), G, inv, rows * cols);
  }
  auto coef = ns_coefficients(opt.schedule, opt.steps);
  bool bf = opt.precision == NsPrecision::bf16;
  if (opt.gram && double(n) >= double(opt.gram_min_aspect) * double(m))
    ns_gram(X, m, n, coef, bf, opt.gram_restarts);
  else
    ns_plain(X, m, n, coef, bf);
  if (tall) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = X[size_t(j * n + i)];
  } else {
    std::copy(X.begin(), X.end(), out);
  }
}

double ns_flops(int64_t rows, int64_t cols, const NsOptions& opt) {
  double m = double(std::min(rows, cols)), n = double(std::max(rows, cols)), s = opt.steps;
  if (!opt.gram || n < double(opt.gram_min_aspect) * m) return s * (4 * m * m * n + 2 * m * m * m);
  int restarts = 0;
  for (int r : opt.gram_restarts)
    if (r > 0 && r < opt.steps) ++restarts;
  // Gram: initial R and final Q X (2 m^2 n each), 2 m^3 per Z, 2 m^3 per Q product (not the
  // first after a (re)start), 4 m^3 per R update (not before a restart or at the end), and a
  // restart costs Q X plus a new R.
  double f = 4 * m * m * n + s * 2 * m * m * m + (s - 1 - restarts) * 2 * m * m * m +
             (s - 1 - restarts) * 4 * m * m * m + restarts * 4 * m * m * n;
  return f;
}

}  // namespace atl::optim
