// GELU, SwiGLU and residual kernels against naive double-precision formulas and finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/cpu/kernels.h"

using namespace atl;
using namespace atl::test;

namespace {
double gelu_ref(double x) { return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
}  // namespace

TEST(Gelu, ForwardBackwardMatchNaive) {
  const int64_t n = 1001;
  auto x = randn(n, 1, 3.0f), dy = randn(n, 2);
  x[0] = 0.0f, x[1] = -30.0f, x[2] = 30.0f, x[3] = 1e-4f;  // the tails and the origin
  std::vector<float> y(n), dx(n, 0.5f);
  cpu::gelu_forward(y.data(), x.data(), n);
  cpu::gelu_backward(dx.data(), dy.data(), x.data(), n);
  std::vector<double> ry(n), rdx(n);
  for (int64_t i = 0; i < n; ++i) {
    ry[i] = gelu_ref(x[i]);
    const double h = 1e-6 * std::max(1.0, std::fabs(double(x[i])));
    rdx[i] = 0.5 + dy[i] * (gelu_ref(x[i] + h) - gelu_ref(x[i] - h)) / (2 * h);
  }
  EXPECT_LT(rel_l2(y, ry), 1e-6);
  EXPECT_LT(rel_l2(dx, rdx), 1e-6);
  for (int64_t i = 0; i < 4; ++i) EXPECT_NEAR(y[i], ry[i], 1e-6 * std::max(1.0, std::fabs(ry[i]))) << x[i];
}

TEST(SwiGLU, ForwardBackwardMatchNaive) {
  const int64_t N = 5, F = 37;
  auto x = randn(N * 2 * F, 3, 2.0f), dy = randn(N * F, 4);
  std::vector<float> y(N * F), dx(N * 2 * F, -0.25f);
  cpu::swiglu_forward(y.data(), x.data(), N, F);
  cpu::swiglu_backward(dx.data(), dy.data(), x.data(), N, F);
  std::vector<double> ry(N * F), rdx(N * 2 * F, -0.25);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t f = 0; f < F; ++f) {
      const double g = x[i * 2 * F + f], u = x[i * 2 * F + F + f], d = dy[i * F + f];
      const double s = 1.0 / (1.0 + std::exp(-g));
      ry[i * F + f] = silu_ref(g) * u;
      rdx[i * 2 * F + f] += d * u * (s + g * s * (1 - s));
      rdx[i * 2 * F + F + f] += d * silu_ref(g);
    }
  EXPECT_LT(rel_l2(y, ry), 1e-6);
  EXPECT_LT(rel_l2(dx, rdx), 1e-6);
}

TEST(Elementwise, FiniteDifferences) {
  const int64_t N = 3, F = 5;
  auto x = randn(N * 2 * F, 5), wl = randn(N * F, 6), wg = randn(N * 2 * F, 7);
  std::vector<float> y(N * F), dx(N * 2 * F, 0.0f);
  cpu::swiglu_backward(dx.data(), wl.data(), x.data(), N, F);
  auto swiglu_loss = [&] {
    cpu::swiglu_forward(y.data(), x.data(), N, F);
    return dot(wl, y);
  };
  EXPECT_LT(fd_check(x, dx, swiglu_loss, 1e-2f, 1000), 1e-3);

  std::vector<float> yg(N * 2 * F), dg(N * 2 * F, 0.0f);
  cpu::gelu_backward(dg.data(), wg.data(), x.data(), N * 2 * F);
  auto gelu_loss = [&] {
    cpu::gelu_forward(yg.data(), x.data(), N * 2 * F);
    return dot(wg, yg);
  };
  EXPECT_LT(fd_check(x, dg, gelu_loss, 1e-2f, 1000), 1e-3);
}

TEST(Residual, AddAndAddInplace) {
  const int64_t n = 333;
  auto a = randn(n, 8), b = randn(n, 9);
  std::vector<float> y(n);
  cpu::add_forward(y.data(), a.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], a[i] + b[i]);
  cpu::add_inplace(y.data(), a.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], (a[i] + b[i]) + a[i]);
}
