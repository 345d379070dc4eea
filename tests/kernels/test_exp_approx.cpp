// kernel_util.h's exp_approx at the ends of its range, which every softmax relies on: +0 below
// -87.3 (-inf included: masked attention scores), exp(88) above 88, and about 1 ulp against
// std::exp inside. It clamps by integer min/max on order keys (so that GCC vectorises it without
// AVX-512 masking): the keys must order like the floats, so that the clamp is the float clamp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/kernel_util.h"

using namespace atl::cpu::detail;

TEST(ExpApprox, OrderKeysOrderLikeTheFloatsAndRoundTrip) {
  // Every 4099th bit pattern (about 1M, both signs, zeros, subnormals, infinities; NaNs skipped).
  float prev = -std::numeric_limits<float>::infinity();
  int checked = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 4099) {
    const float x = std::bit_cast<float>(uint32_t(u));
    if (std::isnan(x)) continue;
    ++checked;
    ASSERT_EQ(std::bit_cast<uint32_t>(from_order_key(float_order_key(x))), uint32_t(u)) << x;
    ASSERT_EQ(float_order_key(x) < float_order_key(prev), x < prev) << x << " vs " << prev;
    ASSERT_EQ(float_order_key(x) > float_order_key(prev), x > prev) << x << " vs " << prev;
    prev = x;
  }
  EXPECT_GT(checked, 1000000);
}

TEST(ExpApprox, RangeEndsAndAccuracy) {
  EXPECT_EQ(std::bit_cast<uint32_t>(exp_approx(-INFINITY)), 0u);  // +0, exactly
  EXPECT_EQ(exp_approx(-87.31f), 0.0f);
  EXPECT_EQ(exp_approx(-1e30f), 0.0f);
  EXPECT_GT(exp_approx(-87.3f), 0.0f);
  EXPECT_EQ(exp_approx(1e3f), exp_approx(88.0f));
  EXPECT_EQ(exp_approx(INFINITY), exp_approx(88.0f));
  EXPECT_EQ(exp_approx(0.0f), 1.0f);
  double worst = 0;
  for (float x = -87.0f; x < 88.0f; x += 0.0137f)
    worst = std::max(worst, std::abs(double(exp_approx(x)) / std::exp(double(x)) - 1.0));
  EXPECT_LT(worst, 4e-7) << "relative error (about 1 ulp = 6e-8..1.2e-7)";
}
