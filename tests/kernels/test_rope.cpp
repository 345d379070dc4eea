// RoPE (rotate-half) on a packed qkv buffer against a naive double-precision rotation.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/kernels.h"

using namespace atl;
using namespace atl::test;

namespace {
std::vector<double> rope_ref(const std::vector<float>& x, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                             double theta, int64_t off) {
  const int64_t S = (H + 2 * KV) * hd, half = hd / 2;
  std::vector<double> y(x.begin(), x.end());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H + KV; ++h)  // q and k heads; v stays
        for (int64_t i = 0; i < half; ++i) {
          const double ang = double(t + off) / std::pow(theta, 2.0 * i / hd);
          const int64_t p = (b * T + t) * S + h * hd + i;
          y[p] = x[p] * std::cos(ang) - x[p + half] * std::sin(ang);
          y[p + half] = x[p + half] * std::cos(ang) + x[p] * std::sin(ang);
        }
  return y;
}
}  // namespace

TEST(Rope, ForwardMatchesNaiveWithOffsetAndGqa) {
  const int64_t B = 2, T = 5, H = 4, KV = 2, hd = 6;
  auto x = randn(B * T * (H + 2 * KV) * hd, 1);
  std::vector<float> y(x.size());
  cpu::rope_forward(y.data(), x.data(), B, T, H, KV, hd, 10000.0f, 0);
  EXPECT_LT(rel_l2(y, rope_ref(x, B, T, H, KV, hd, 10000.0, 0)), 1e-6);
  cpu::rope_forward(y.data(), x.data(), B, T, H, KV, hd, 500.0f, 7);  // table must be rebuilt
  EXPECT_LT(rel_l2(y, rope_ref(x, B, T, H, KV, hd, 500.0, 7)), 1e-6);
  // The v heads are copied bit for bit.
  const int64_t S = (H + 2 * KV) * hd;
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t i = (H + KV) * hd; i < S; ++i) ASSERT_EQ(y[bt * S + i], x[bt * S + i]);
}

TEST(Rope, BackwardIsTransposeAndAccumulates) {
  const int64_t B = 1, T = 9, H = 3, KV = 1, hd = 8;
  auto x = randn(B * T * (H + 2 * KV) * hd, 2), wl = randn(x.size(), 3), d0 = randn(x.size(), 4);
  std::vector<float> y(x.size()), dx = d0;
  cpu::rope_backward(dx.data(), wl.data(), B, T, H, KV, hd, 10000.0f, 2);
  for (size_t i = 0; i < dx.size(); ++i) dx[i] -= d0[i];
  auto loss = [&] {
    cpu::rope_forward(y.data(), x.data(), B, T, H, KV, hd, 10000.0f, 2);
    return dot(wl, y);
  };
  EXPECT_LT(fd_check(x, dx, loss, 1e-2f, 1000), 1e-3);
}

TEST(Rope, RejectsOddHeadDim) {
  std::vector<float> x(5 * 3), y(x.size());
  EXPECT_THROW(cpu::rope_forward(y.data(), x.data(), 1, 1, 1, 1, 5, 10000.0f, 0), atl::Error);
}
