// AdamW over several steps against a scalar double-precision transcription of the paper's
// algorithm, its AVX-512 loop against the generic one, plus the clipping reductions.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <string>

#include "kernel_test_util.h"
#include "kernels/cpu/adamw_paths.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernels.h"

using namespace atl;
using namespace atl::test;

TEST(AdamW, SeveralStepsMatchScalarReference) {
  const int64_t n = 1000;
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
  auto p = randn(n, 1);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> rp(p.begin(), p.end()), rm(n, 0.0), rv(n, 0.0);
  for (int64_t t = 1; t <= 5; ++t) {
    auto g = randn(n, 100 + t);
    cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, gs, t);
    for (int64_t i = 0; i < n; ++i) {
      const double gi = double(g[i]) * gs;
      rm[i] = b1 * rm[i] + (1 - double(b1)) * gi;
      rv[i] = b2 * rv[i] + (1 - double(b2)) * gi * gi;
      const double mh = rm[i] / (1 - std::pow(double(b1), double(t)));
      const double vh = rv[i] / (1 - std::pow(double(b2), double(t)));
      rp[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * rp[i]);
    }
  }
  EXPECT_LT(rel_l2(p, rp), 1e-6);
  EXPECT_LT(rel_l2(m, rm), 1e-6);
  EXPECT_LT(rel_l2(v, rv), 1e-6);
}

// The AVX-512 loop spells out the scalar loop's element arithmetic (adamw_update.h: every add inside
// an explicit fma, sqrt and division correctly rounded in any width), so the two must agree bit for
// bit, over steps (t changes the bias corrections) and for a length with a vector
// remainder, and whether the loop runs on one thread or is split over two. adamw_step must take
// the active path's loop.
TEST(AdamW, Avx512PathEqualsTheGenericPathBitwise) {
  std::string why;
  if (!cpu::isa_supported(cpu::Isa::avx512, &why)) GTEST_SKIP() << "no AVX-512 path on this CPU: " << why;
  const int64_t n = 100003;
  const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
  const int before = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    auto p = randn(n, 5), pa = p, pd = p;
    std::vector<float> m(n, 0.0f), v(n, 0.0f), ma = m, va = v, md = m, vd = v;
    for (int64_t t = 1; t <= 4; ++t) {
      auto g = randn(n, 200 + t, t == 3 ? 1e-20f : 1.0f);  // one step of near-zero gradients: eps dominates
      cpu::adamw_step_generic(p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps, wd, gs, t);
      cpu::adamw_step_avx512(pa.data(), g.data(), ma.data(), va.data(), n, lr, b1, b2, eps, wd, gs, t);
      cpu::adamw_step(pd.data(), g.data(), md.data(), vd.data(), n, lr, b1, b2, eps, wd, gs, t);
    }
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(pa[i], p[i]) << i << " threads " << threads;
      ASSERT_EQ(ma[i], m[i]) << i;
      ASSERT_EQ(va[i], v[i]) << i;
      ASSERT_EQ(pd[i], p[i]) << i;
    }
    EXPECT_NE(p[0], randn(1, 5)[0]);  // the steps moved the parameters
  }
  omp_set_num_threads(before);
}

TEST(AdamW, SumSquaresAndScale) {
  const int64_t n = 100003;
  auto x = randn(n, 2);
  double ref = 0;
  for (float f : x) ref += double(f) * f;
  EXPECT_NEAR(cpu::sum_squares(x.data(), n), ref, 1e-9 * ref);
  auto y = x;
  cpu::scale_inplace(y.data(), -0.5f, n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i] * -0.5f);
}
