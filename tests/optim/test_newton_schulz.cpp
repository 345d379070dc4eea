// Newton-Schulz: singular values of the output in each schedule's documented band, the Gram form
// equal to the plain one, bf16 close to f32, tall handled as the transpose of wide.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "optim/linalg.h"
#include "optim/newton_schulz.h"
#include "tensor/rng.h"

using namespace atl;
using namespace atl::optim;

namespace {

std::vector<float> randn(int64_t n, uint64_t seed) {
  Tensor t = Tensor::empty({n});
  Rng(seed).fill_normal(t, 0.f, 1.f);
  return t.to_vector();
}

// Singular values of X [m, n] from the eigenvalues of the smaller Gram matrix.
std::vector<float> singular_values(const std::vector<float>& X, int64_t m, int64_t n) {
  int64_t k = std::min(m, n);
  std::vector<float> G(size_t(k * k)), w(static_cast<size_t>(k));
  if (m <= n)
    cpu::gemm(false, true, m, m, n, 1.f, X.data(), n, X.data(), n, 0.f, G.data(), m);
  else
    cpu::gemm(true, false, n, n, m, 1.f, X.data(), n, X.data(), n, 0.f, G.data(), n);
  eigh_sym(G.data(), w.data(), k);
  for (auto& x : w) x = std::sqrt(std::max(x, 0.f));
  return w;
}

double rel(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> ortho(const std::vector<float>& G, int64_t m, int64_t n, NsOptions o) {
  std::vector<float> out(G.size());
  orthogonalize(G.data(), out.data(), m, n, o);
  return out;
}

}  // namespace

TEST(NewtonSchulz, SingularValueBands) {
  // A Gaussian 64 x 256 matrix: singular values spread over about [0.5, 1.5] x sqrt(256).
  const int64_t m = 64, n = 256;
  auto G = randn(m * n, 7);
  struct Case {
    NsSchedule s;
    int steps;
    NsPrecision p;
    bool gram;
    float lo, hi;
  };
  // quintic: Jordan's band (measured [0.68, 1.13] here); Polar Express converges to 1 (f32: 1 +- 1e-4).
  const Case cases[] = {
      {NsSchedule::quintic, 5, NsPrecision::f32, false, 0.6f, 1.2f},
      {NsSchedule::quintic, 5, NsPrecision::f32, true, 0.6f, 1.2f},
      {NsSchedule::quintic, 5, NsPrecision::bf16, false, 0.6f, 1.2f},
      {NsSchedule::polar_express, 8, NsPrecision::f32, false, 0.995f, 1.005f},
      {NsSchedule::polar_express, 8, NsPrecision::f32, true, 0.995f, 1.005f},
      {NsSchedule::polar_express, 8, NsPrecision::bf16, true, 0.95f, 1.05f},
  };
  for (const auto& c : cases) {
    NsOptions o;
    o.schedule = c.s;
    o.steps = c.steps;
    o.precision = c.p;
    o.gram = c.gram;
    auto sv = singular_values(ortho(G, m, n, o), m, n);
    auto [mn, mx] = std::minmax_element(sv.begin(), sv.end());
    std::printf("  %s %d steps %s%s: singular values in [%.4f, %.4f]\n",
                c.s == NsSchedule::quintic ? "quintic" : "polar_express", c.steps,
                c.p == NsPrecision::bf16 ? "bf16" : "f32", c.gram ? " gram" : "", *mn, *mx);
    EXPECT_GE(*mn, c.lo) << "schedule " << int(c.s) << " bf16 " << int(c.p) << " gram " << c.gram;
    EXPECT_LE(*mx, c.hi) << "schedule " << int(c.s) << " bf16 " << int(c.p) << " gram " << c.gram;
  }
  // And the input itself is far outside those bands: the iteration did the work.
  auto sv_in = singular_values(G, m, n);
  EXPECT_GT(*std::max_element(sv_in.begin(), sv_in.end()), 10.f);
}

TEST(NewtonSchulz, GramEqualsPlainWithAnyRestarts) {
  const int64_t m = 48, n = 384;
  auto G = randn(m * n, 11);
  for (auto s : {NsSchedule::quintic, NsSchedule::polar_express}) {
    NsOptions o;
    o.schedule = s;
    auto plain = ortho(G, m, n, o);
    o.gram = true;
    for (std::vector<int> restarts : {std::vector<int>{}, std::vector<int>{2}, std::vector<int>{1, 3}}) {
      o.gram_restarts = restarts;
      EXPECT_LT(rel(ortho(G, m, n, o), plain), 1e-4) << int(s);
    }
  }
}

TEST(NewtonSchulz, GramMinAspectFallsBackToPlainOnSquare) {
  const int64_t m = 64;
  auto G = randn(m * m, 5);
  NsOptions o;
  auto plain = ortho(G, m, m, o);
  o.gram = true;
  auto gram = ortho(G, m, m, o);
  EXPECT_GT(rel(gram, plain), 0.0);  // a different evaluation order: not bit-identical
  EXPECT_LT(rel(gram, plain), 1e-4);
  o.gram_min_aspect = 2.f;  // 1:1 is below 2:1, so the plain form runs
  EXPECT_EQ(rel(ortho(G, m, m, o), plain), 0.0);
  EXPECT_EQ(ns_flops(m, m, o), ns_flops(m, m, NsOptions{}));
}

TEST(NewtonSchulz, TallIsTransposeOfWideAndBf16IsClose) {
  const int64_t m = 40, n = 120;
  auto G = randn(m * n, 3);
  std::vector<float> Gt(G.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) Gt[size_t(j * m + i)] = G[size_t(i * n + j)];
  NsOptions o;
  auto wide = ortho(G, m, n, o), tall = ortho(Gt, n, m, o);
  std::vector<float> back(G.size());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) back[size_t(i * n + j)] = tall[size_t(j * m + i)];
  EXPECT_LT(rel(back, wide), 1e-6);
  o.precision = NsPrecision::bf16;
  double d = rel(ortho(G, m, n, o), wide);
  EXPECT_GT(d, 1e-5);  // it really ran in bf16
  EXPECT_LT(d, 0.05);
}

TEST(NewtonSchulz, CoefficientSchedules) {
  auto q = ns_coefficients(NsSchedule::quintic, 3);
  ASSERT_EQ(q.size(), 3u);
  EXPECT_FLOAT_EQ(q[2][0], 3.4445f);
  EXPECT_FLOAT_EQ(q[2][1], -4.7750f);
  EXPECT_FLOAT_EQ(q[2][2], 2.0315f);
  auto pe = ns_coefficients(NsSchedule::polar_express, 10);
  EXPECT_NEAR(pe[0][0], 8.28721201814563 / 1.01, 1e-5);
  EXPECT_NEAR(pe[0][1], -23.595886519098837 / std::pow(1.01, 3), 1e-4);
  EXPECT_FLOAT_EQ(pe[9][0], 1.875f);  // the last triple repeats, without the safety factor
  EXPECT_FLOAT_EQ(pe[9][2], 0.375f);
}
