// kernel_util.h's exp_approx at the ends of its range, which every softmax relies on: +0 below
// -87.3 (-inf included: masked attention scores), exp(88) above 88, and about 1 ulp against
// std::exp inside.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/kernel_util.h"

using namespace atl::cpu::detail;

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
