// GELU's AVX-512 variant against the generic (AVX2) one, bit for bit on every element: forward,
// backward (accumulating), the bf16 forms and the bf16 hand-off producers (gelu_paths.h). The
// multi-rank parity bounds sit on GELU's bits, so the variants must not differ anywhere: sizes
// cover every tail length of both widths, inputs cover zeros of both signs, subnormals, large |x|
// (where tanh saturates and exp_approx clamps), inf and NaN. Both variants are called directly and
// through the entry points with the path forced by set_isa (hardware.isa / ATOLL_ISA's override).
#include <gtest/gtest.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/gelu_bf16.h"
#include "kernels/cpu/gelu_paths.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernels.h"

using namespace atl;

namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Normal values at several scales, with the special values sprinkled in at varying positions so
// that they land in vector bodies and in tails.
std::vector<float> inputs(int64_t n, uint64_t seed) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const float special[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 3.0f, -3.0f, 9.0f, -9.0f, 10.0f, -10.0f, 20.0f, -20.0f,
                           44.0f, -44.0f, 90.0f, -90.0f, 1e4f, -1e4f, 1e30f, -1e30f,
                           std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(), inf, -inf, nan,
                           -nan};
  auto x = test::randn(size_t(n), seed, 1.0f);
  const auto wide = test::randn(size_t(n), seed + 1, 6.0f);
  for (int64_t i = 0; i < n; ++i) {
    if (i % 3 == 1) x[size_t(i)] = wide[size_t(i)];
    if (i % 7 == 3) x[size_t(i)] = special[size_t((i / 7 + seed) % std::size(special))];
  }
  return x;
}

std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = float_to_bf16(x[i]);
  return b;
}

void expect_same(const std::vector<float>& a, const std::vector<float>& b, const char* what, int64_t n) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(bits(a[i]), bits(b[i])) << what << " n=" << n << " i=" << i << ": " << a[i] << " vs " << b[i];
}
void expect_same(const std::vector<bf16>& a, const std::vector<bf16>& b, const char* what, int64_t n) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i].bits, b[i].bits) << what << " n=" << n << " i=" << i;
}

std::vector<int64_t> sizes() {
  std::vector<int64_t> s;
  for (int64_t n = 0; n <= 70; ++n) s.push_back(n);
  for (int64_t n : {127, 128, 129, 255, 1000, 4099, 32768 + 13, 100003}) s.push_back(n);  // 32781+: threaded
  return s;
}

bool skip_without_avx512(std::string* why) { return !cpu::isa_supported(cpu::Isa::avx512, why); }

}  // namespace

TEST(GeluPaths, Avx512EqualsAvx2BitwiseF32) {
  std::string why;
  if (skip_without_avx512(&why)) GTEST_SKIP() << "no AVX-512 path on this CPU: " << why;
  const int before = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (int64_t n : sizes()) {
      const auto x = inputs(n, uint64_t(n) + 11), dy = test::randn(size_t(n), uint64_t(n) + 3);
      const auto acc = test::randn(size_t(n), uint64_t(n) + 5);
      std::vector<float> y2(static_cast<size_t>(n)), y5(static_cast<size_t>(n)), g2 = acc, g5 = acc;
      cpu::gelu_avx2::forward(y2.data(), x.data(), n);
      cpu::gelu_avx512::forward(y5.data(), x.data(), n);
      expect_same(y2, y5, "forward", n);
      cpu::gelu_avx2::backward(g2.data(), dy.data(), x.data(), n);
      cpu::gelu_avx512::backward(g5.data(), dy.data(), x.data(), n);
      expect_same(g2, g5, "backward", n);
      if (n == 100003) {  // the kernels computed something: GELU(1) ~ 0.8412, and backward moved acc
        EXPECT_NE(bits(g2[0]), bits(acc[0]));
      }
    }
  }
  omp_set_num_threads(before);
  std::vector<float> one{1.0f}, y(1);
  cpu::gelu_avx512::forward(y.data(), one.data(), 1);
  EXPECT_NEAR(y[0], 0.841192f, 1e-5f);
}

TEST(GeluPaths, Avx512EqualsAvx2BitwiseBf16FormsAndHandOff) {
  std::string why;
  if (skip_without_avx512(&why)) GTEST_SKIP() << "no AVX-512 path on this CPU: " << why;
  const int before = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (int64_t n : sizes()) {
      const auto x = inputs(n, uint64_t(n) + 21), dy = test::randn(size_t(n), uint64_t(n) + 7);
      const auto acc = test::randn(size_t(n), uint64_t(n) + 9);
      const auto xb = to_bf16(x);
      std::vector<float> y2(static_cast<size_t>(n)), y5(static_cast<size_t>(n));
      std::vector<bf16> s2(static_cast<size_t>(n)), s5(static_cast<size_t>(n)), o2(static_cast<size_t>(n)), o5(static_cast<size_t>(n));
      cpu::gelu_avx2::forward_keep_bf16(y2.data(), s2.data(), x.data(), n);
      cpu::gelu_avx512::forward_keep_bf16(y5.data(), s5.data(), x.data(), n);
      expect_same(y2, y5, "forward_keep_bf16", n);
      expect_same(s2, s5, "forward_keep_bf16 saved", n);
      cpu::gelu_avx2::forward_keep_bf16(y2.data(), o2.data(), s2.data(), x.data(), n);
      cpu::gelu_avx512::forward_keep_bf16(y5.data(), o5.data(), s5.data(), x.data(), n);
      expect_same(y2, y5, "forward hand-off", n);
      expect_same(o2, o5, "forward hand-off out_bf16", n);
      expect_same(s2, s5, "forward hand-off saved", n);
      for (bool accumulate : {true, false}) {
        std::vector<float> g2 = acc, g5 = acc;
        cpu::gelu_avx2::backward_bf16(g2.data(), dy.data(), xb.data(), n, accumulate);
        cpu::gelu_avx512::backward_bf16(g5.data(), dy.data(), xb.data(), n, accumulate);
        expect_same(g2, g5, accumulate ? "backward_bf16 accumulate" : "backward_bf16 fresh", n);
      }
    }
  }
  // The backward hand-off producer over [N, OC] rows: every OC tail of both widths, N over several
  // kBiasSumRows blocks (and past the threading threshold for the largest).
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (int64_t N : {1, 3, 64, 65, 130}) {
      for (int64_t OC : {1, 7, 8, 9, 15, 16, 17, 23, 31, 33, 47, 64, 100, 257, 384}) {
        const int64_t n = N * OC;
        const auto xb = to_bf16(inputs(n, uint64_t(n) + 31));
        const auto dy = test::randn(size_t(n), uint64_t(n) + 17);
        const int64_t nblk = (N + cpu::kBiasSumRows - 1) / cpu::kBiasSumRows;
        std::vector<float> g2(static_cast<size_t>(n)), g5(static_cast<size_t>(n)), p2(size_t(nblk * OC), 7.0f), p5 = p2;
        std::vector<bf16> b2(static_cast<size_t>(n)), b5(static_cast<size_t>(n));
        cpu::gelu_avx2::backward_bf16_rows(g2.data(), b2.data(), p2.data(), dy.data(), xb.data(), N, OC);
        cpu::gelu_avx512::backward_bf16_rows(g5.data(), b5.data(), p5.data(), dy.data(), xb.data(), N, OC);
        expect_same(g2, g5, "backward_bf16_rows dinp", n);
        expect_same(b2, b5, "backward_bf16_rows dinp_bf16", n);
        expect_same(p2, p5, "backward_bf16_rows partials", n);
        EXPECT_NE(bits(p2[0]), bits(7.0f)) << "partials were written";
      }
    }
  }
  omp_set_num_threads(before);
}

// The entry points follow the forced path: avx2 gives gelu_avx2's bits, avx512 gelu_avx512's.
TEST(GeluPaths, EntryPointsFollowTheForcedIsa) {
  std::string why;
  if (skip_without_avx512(&why)) GTEST_SKIP() << "no AVX-512 path on this CPU: " << why;
  const cpu::Isa saved = cpu::active_isa();
  const int64_t n = 4099;
  const auto x = inputs(n, 5), dy = test::randn(size_t(n), 6);
  std::vector<float> ref(static_cast<size_t>(n)), got(static_cast<size_t>(n)), g(size_t(n), 0.0f), gref(size_t(n), 0.0f);
  cpu::gelu_avx2::forward(ref.data(), x.data(), n);
  cpu::gelu_avx2::backward(gref.data(), dy.data(), x.data(), n);
  for (cpu::Isa isa : {cpu::Isa::avx2, cpu::Isa::avx512}) {
    cpu::set_isa(isa);
    const char* keep = std::getenv("ATOLL_GELU_PATH");
    EXPECT_EQ(cpu::detail::gelu_avx512_active(), isa == cpu::Isa::avx512 && !(keep && std::string_view(keep) == "avx2"));
    cpu::gelu_forward(got.data(), x.data(), n);
    expect_same(ref, got, cpu::isa_name(isa), n);
    std::fill(g.begin(), g.end(), 0.0f);
    cpu::gelu_backward(g.data(), dy.data(), x.data(), n);
    expect_same(gref, g, cpu::isa_name(isa), n);
  }
  cpu::set_isa(saved);
}
