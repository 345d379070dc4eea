// Shared helpers for the CPU kernel tests: seeded random data, relative L2 error of plain
// vectors, and a central-difference gradient check.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace atl::test {

inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<int32_t> randint(size_t n, int32_t lo, int32_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> d(lo, hi - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ||a - b|| / ||b|| with b the reference.
template <typename A, typename B>
double rel_l2(const std::vector<A>& a, const std::vector<B>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

inline double dot(const std::vector<float>& w, const std::vector<float>& y) {
  double s = 0;
  for (size_t i = 0; i < w.size(); ++i) s += double(w[i]) * double(y[i]);
  return s;
}

// Numeric gradient of loss() with respect to x at up to max_checks coordinates (spread evenly),
// compared with the analytic gradient; returns the relative L2 error over the checked set.
inline double fd_check(std::vector<float>& x, const std::vector<float>& analytic,
                       const std::function<double()>& loss, float h = 1e-2f, size_t max_checks = 48) {
  const size_t stride = std::max<size_t>(1, x.size() / max_checks);
  std::vector<double> num, ana;
  for (size_t i = 0; i < x.size(); i += stride) {
    const float x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    num.push_back((lp - lm) / (2.0 * double(h)));
    ana.push_back(analytic[i]);
  }
  return rel_l2(ana, num);
}

}  // namespace atl::test
