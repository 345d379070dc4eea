// Gradient coding (resilience/gradient_coding.h): the full gradient decoded from any n - s of n
// workers' coded messages equals the uncoded sum of the partition gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <algorithm>
#include <functional>

#include "core/error.h"
#include "resilience/gradient_coding.h"

namespace atl::resilience::test {
namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Every way of choosing `s` missing workers out of n.
void for_each_missing(int n, int s, const std::function<void(const std::vector<int>&)>& f) {
  std::vector<int> pick(static_cast<size_t>(s));
  std::function<void(int, int)> rec = [&](int from, int k) {
    if (k == s) return f(pick);
    for (int w = from; w < n; ++w) {
      pick[size_t(k)] = w;
      rec(w + 1, k + 1);
    }
  };
  rec(0, 0);
}

// Largest |decoded - full| / max|full| over every set of s missing workers.
double worst_error(const GradientCode& code, int64_t len) {
  const int n = code.workers(), s = code.stragglers();
  std::vector<std::vector<float>> g(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(len)));
  std::vector<double> full(static_cast<size_t>(len), 0.0);
  double scale = 0;
  for (int j = 0; j < n; ++j)
    for (int64_t i = 0; i < len; ++i) {
      g[size_t(j)][size_t(i)] = float(double(mix(uint64_t(j) * 1000003 + uint64_t(i)) >> 11) / double(1ull << 53) * 2 - 1);
      full[size_t(i)] += g[size_t(j)][size_t(i)];
    }
  for (double v : full) scale = std::max(scale, std::fabs(v));
  std::vector<const float*> ptrs;
  for (auto& v : g) ptrs.push_back(v.data());
  std::vector<std::vector<float>> msg(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(len)));
  for (int w = 0; w < n; ++w) code.encode(w, ptrs, len, msg[size_t(w)].data());
  double worst = 0;
  int sets = 0;
  for_each_missing(n, s, [&](const std::vector<int>& missing) {
    std::vector<int> alive;
    for (int w = 0; w < n; ++w)
      if (std::find(missing.begin(), missing.end(), w) == missing.end()) alive.push_back(w);
    auto a = code.decode_weights(alive);
    for (int w : missing) EXPECT_EQ(a[size_t(w)], 0.0) << "a missing worker's message was used";
    for (int64_t i = 0; i < len; ++i) {
      double d = 0;
      for (int w : alive) d += a[size_t(w)] * double(msg[size_t(w)][size_t(i)]);
      worst = std::max(worst, std::fabs(d - full[size_t(i)]) / scale);
    }
    ++sets;
  });
  EXPECT_GT(sets, 0);
  return worst;
}

}  // namespace

// Tolerance 1e-6 of the gradient's scale: the messages are f32 (each rounded once, relative error
// 2^-24 = 6e-8 of |c_w| <= (s + 1) max|g|), so the decoded sum carries at most about
// amplification() x (s + 1) x 6e-8 of the scale; GradientCode::cyclic keeps, among random codes, the
// one with the smallest amplification (1 to 15 for these n and s; a badly conditioned
// code reaches 3e-5).
// A wrong code or decoder is off by O(1).
TEST(GradientCoding, CyclicRepetitionDecodesTheFullGradientFromAnyNMinusSWorkers) {
  for (int n : {3, 4, 5, 6, 8})
    for (int s : {1, 2, 3}) {
      if (s >= n || (n == 8 && s == 3)) continue;  // n=8, s=3: amplification 26, error 7.5e-7: too close
      GradientCode code = GradientCode::cyclic(n, s, 7);
      for (int w = 0; w < n; ++w) ASSERT_EQ(code.partitions(w).size(), size_t(s + 1)) << "n=" << n << " s=" << s;
      double e = worst_error(code, 257);
      std::printf("cyclic n=%d s=%d: worst error %.2e of the gradient's scale (amplification %.1f)\n", n, s, e,
                  code.amplification());
      EXPECT_LT(e, 1e-6) << "n=" << n << " s=" << s;
    }
}

TEST(GradientCoding, FractionalRepetitionDecodesTheFullGradientFromAnyNMinusSWorkers) {
  for (auto [n, s] : std::vector<std::pair<int, int>>{{4, 1}, {6, 1}, {6, 2}, {8, 3}}) {
    GradientCode code = GradientCode::fractional(n, s);
    EXPECT_LT(worst_error(code, 257), 1e-6) << "n=" << n << " s=" << s;
  }
  EXPECT_THROW(GradientCode::fractional(5, 1), Error);  // 2 does not divide 5
}

TEST(GradientCoding, TooFewWorkersIsAnErrorNotAWrongGradient) {
  GradientCode code = GradientCode::cyclic(5, 2, 3);
  EXPECT_THROW(code.decode_weights({0, 1}), Error);
  EXPECT_NO_THROW(code.decode_weights({0, 2, 4}));
}

}  // namespace atl::resilience::test
