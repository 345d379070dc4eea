// LayerNorm and RMSNorm against naive double-precision formulas and finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/cpu/kernels.h"

using namespace atl;
using namespace atl::test;

namespace {

// Reference backward by the textbook chain rule through mean and variance, in double.
struct LnRef {
  std::vector<double> y, dx, dw, db;
};
LnRef layernorm_ref(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                    const std::vector<float>& dy, int64_t N, int64_t C, double eps) {
  LnRef r{std::vector<double>(N * C), std::vector<double>(N * C), std::vector<double>(C), std::vector<double>(C)};
  for (int64_t i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x[i * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + eps);
    double g_mean = 0, gx_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xh = (x[i * C + c] - m) * s;
      r.y[i * C + c] = xh * w[c] + b[c];
      r.dw[c] += dy[i * C + c] * xh;
      r.db[c] += dy[i * C + c];
      g_mean += dy[i * C + c] * w[c] / C;
      gx_mean += dy[i * C + c] * w[c] * xh / C;
    }
    for (int64_t c = 0; c < C; ++c) {
      const double xh = (x[i * C + c] - m) * s;
      r.dx[i * C + c] = s * (dy[i * C + c] * w[c] - g_mean - xh * gx_mean);
    }
  }
  return r;
}

}  // namespace

TEST(LayerNorm, ForwardBackwardMatchNaive) {
  const int64_t N = 5, C = 67;  // C > 64: two column blocks in the weight gradient
  auto x = randn(N * C, 1, 2.0f), w = randn(C, 2), b = randn(C, 3), dy = randn(N * C, 4);
  for (auto& v : x) v += 3.0f;  // an offset mean exercises the two-pass variance
  std::vector<float> y(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
  auto ref = layernorm_ref(x, w, b, dy, N, C, 1e-5);
  EXPECT_LT(rel_l2(y, ref.y), 1e-6);
  std::vector<float> dx(N * C, 0.5f), dw(C, 0.25f), db(C, -1.0f);  // nonzero: backward accumulates
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                          rstd.data(), N, C);
  for (auto& v : ref.dx) v += 0.5;
  for (auto& v : ref.dw) v += 0.25;
  for (auto& v : ref.db) v -= 1.0;
  EXPECT_LT(rel_l2(dx, ref.dx), 1e-5);
  EXPECT_LT(rel_l2(dw, ref.dw), 1e-5);
  EXPECT_LT(rel_l2(db, ref.db), 1e-5);
}

TEST(LayerNorm, NoBiasForward) {
  const int64_t N = 3, C = 9;
  auto x = randn(N * C, 5), w = randn(C, 6), dy = randn(N * C, 7);
  std::vector<float> zero(C, 0.0f), y(N * C), mean(N), rstd(N);
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C, 1e-5f);
  EXPECT_LT(rel_l2(y, layernorm_ref(x, w, zero, dy, N, C, 1e-5).y), 1e-6);
}

TEST(LayerNorm, FiniteDifferences) {
  const int64_t N = 3, C = 7;
  auto x = randn(N * C, 8), w = randn(C, 9), b = randn(C, 10), wl = randn(N * C, 11);
  std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), wl.data(), x.data(), w.data(), mean.data(),
                          rstd.data(), N, C);
  auto loss = [&] {
    std::vector<float> m(N), r(N);
    cpu::layernorm_forward(y.data(), m.data(), r.data(), x.data(), w.data(), b.data(), N, C, 1e-5f);
    return dot(wl, y);
  };
  EXPECT_LT(fd_check(x, dx, loss, 1e-2f, 1000), 2e-3);
  EXPECT_LT(fd_check(w, dw, loss), 2e-3);
  EXPECT_LT(fd_check(b, db, loss), 2e-3);
}

TEST(RMSNorm, ForwardBackwardMatchNaive) {
  const int64_t N = 4, C = 71;
  auto x = randn(N * C, 12), w = randn(C, 13), dy = randn(N * C, 14);
  std::vector<float> y(N * C), rstd(N);
  cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  std::vector<double> ry(N * C), rdx(N * C, 1.0), rdw(C, 2.0);
  for (int64_t i = 0; i < N; ++i) {
    double ms = 0;
    for (int64_t c = 0; c < C; ++c) ms += double(x[i * C + c]) * x[i * C + c];
    const double s = 1.0 / std::sqrt(ms / C + 1e-6);
    double gx = 0;
    for (int64_t c = 0; c < C; ++c) {
      ry[i * C + c] = x[i * C + c] * s * w[c];
      rdw[c] += dy[i * C + c] * x[i * C + c] * s;
      gx += dy[i * C + c] * w[c] * x[i * C + c] * s / C;
    }
    for (int64_t c = 0; c < C; ++c) rdx[i * C + c] += s * (dy[i * C + c] * w[c] - x[i * C + c] * s * gx);
  }
  EXPECT_LT(rel_l2(y, ry), 1e-6);
  std::vector<float> dx(N * C, 1.0f), dw(C, 2.0f);
  cpu::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C);
  EXPECT_LT(rel_l2(dx, rdx), 1e-5);
  EXPECT_LT(rel_l2(dw, rdw), 1e-5);
}

TEST(RMSNorm, FiniteDifferences) {
  const int64_t N = 3, C = 6;
  auto x = randn(N * C, 15), w = randn(C, 16), wl = randn(N * C, 17);
  std::vector<float> y(N * C), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f);
  cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6f);
  cpu::rmsnorm_backward(dx.data(), dw.data(), wl.data(), x.data(), w.data(), rstd.data(), N, C);
  auto loss = [&] {
    cpu::rmsnorm_forward(y.data(), nullptr, x.data(), w.data(), N, C, 1e-6f);
    return dot(wl, y);
  };
  EXPECT_LT(fd_check(x, dx, loss, 1e-2f, 1000), 2e-3);
  EXPECT_LT(fd_check(w, dw, loss), 2e-3);
}
