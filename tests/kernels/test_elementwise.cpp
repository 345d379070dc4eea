// GELU, SwiGLU and residual kernels against naive double-precision formulas and finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernel_test_util.h"
#include "kernels/cpu/gelu_bf16.h"
#include "kernels/cpu/gemm.h"
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

// bf16 mode's GELU forms (gelu.cpp) are the fp32 kernels with the casts folded in, so they must give
// the fp32 kernels' bits: forward's output and f32_to_bf16 of the input, backward's gradient from
// the widened copy (widening is exact), written or accumulated. n is odd and above the parallel
// threshold so the vector remainder and the thread split are both exercised; NaN and the
// rounding ties check the cast's rule.
TEST(Gelu, Bf16FormsGiveTheFp32KernelsBits) {
  const int64_t n = 100003;
  auto x = randn(n, 11, 3.0f), dy = randn(n, 12);
  x[0] = std::nanf(""), x[1] = 1.00390625f, x[2] = 1.01171875f, x[3] = -30.0f;  // NaN, ties to even
  std::vector<float> y(n), y16(n), xw(n), acc(n, 0.25f), acc16(n, 0.25f), zero(n, 0.0f), fresh(n, -7.0f);
  std::vector<bf16> ref(n), saved(n);
  cpu::gelu_forward(y.data(), x.data(), n);
  cpu::f32_to_bf16(x.data(), ref.data(), n);
  cpu::gelu_forward_keep_bf16(y16.data(), saved.data(), x.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(saved[i].bits, ref[i].bits) << i;
    if (i > 0) {
      ASSERT_EQ(y16[i], y[i]) << i;
    }
  }
  ASSERT_TRUE(std::isnan(y16[0]));
  cpu::bf16_to_f32(saved.data(), xw.data(), n);
  cpu::gelu_backward(acc.data(), dy.data(), xw.data(), n);
  cpu::gelu_backward(zero.data(), dy.data(), xw.data(), n);
  cpu::gelu_backward_bf16(acc16.data(), dy.data(), saved.data(), n, true);
  cpu::gelu_backward_bf16(fresh.data(), dy.data(), saved.data(), n, false);  // overwrites the -7s
  for (int64_t i = 1; i < n; ++i) {
    ASSERT_EQ(acc16[i], acc[i]) << i;
    ASSERT_EQ(fresh[i], zero[i]) << i;  // == takes -0 and +0 as equal: written s*d may be -0
  }
}

// The hand-off forms (bf16_handoff.h) fold the next product's cast (and, backward, the bias's
// column sums) into GELU: their bits must be the unfused path's, GELU then f32_to_bf16 (and
// linear_bf16's sums of 64-row blocks, rows in order from 0). N = 333 rows leaves a partial last
// block, OC = 301 a vector remainder, N·OC is above the parallel threshold; NaN and the rounding
// ties check the cast's rule on the output side too.
TEST(Gelu, HandOffFormsGiveTheUnfusedBits) {
  const int64_t N = 333, OC = 301, n = N * OC;
  auto x = randn(n, 21, 3.0f), dy = randn(n, 22);
  x[0] = std::nanf(""), x[1] = 1.00390625f, x[2] = -30.0f;
  dy[5] = 1.00390625f, dy[6] = std::nanf("");
  std::vector<float> y(n), y2(n), ref_g(n), g(n, -7.0f);
  std::vector<bf16> saved(n), saved2(n), yb(n), ref_yb(n), gb(n), ref_gb(n);
  cpu::gelu_forward_keep_bf16(y.data(), saved.data(), x.data(), n);
  cpu::f32_to_bf16(y.data(), ref_yb.data(), n);
  cpu::gelu_forward_keep_bf16(y2.data(), yb.data(), saved2.data(), x.data(), n);
  auto bits = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
  };
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits(y2[i]), bits(y[i])) << i;
    ASSERT_EQ(saved2[i].bits, saved[i].bits) << i;
    ASSERT_EQ(yb[i].bits, ref_yb[i].bits) << i;
  }
  cpu::gelu_backward_bf16(ref_g.data(), dy.data(), saved.data(), n, false);
  cpu::f32_to_bf16(ref_g.data(), ref_gb.data(), n);
  const int64_t nblk = (N + cpu::kBiasSumRows - 1) / cpu::kBiasSumRows;
  std::vector<float> ref_p(size_t(nblk * OC), 0.0f), p(size_t(nblk * OC), 3.0f);
  for (int64_t blk = 0; blk < nblk; ++blk)
    for (int64_t i = blk * cpu::kBiasSumRows; i < std::min(N, (blk + 1) * cpu::kBiasSumRows); ++i)
      for (int64_t o = 0; o < OC; ++o) ref_p[size_t(blk * OC + o)] += ref_g[size_t(i * OC + o)];
  cpu::gelu_backward_bf16_rows(g.data(), gb.data(), p.data(), dy.data(), saved.data(), N, OC);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits(g[i]), bits(ref_g[i])) << i;
    ASSERT_EQ(gb[i].bits, ref_gb[i].bits) << i;
  }
  for (size_t i = 0; i < p.size(); ++i) ASSERT_EQ(bits(p[i]), bits(ref_p[i])) << i;
  ASSERT_TRUE(std::isnan(p[0]));  // the NaN input's column carries its NaN into block 0
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
