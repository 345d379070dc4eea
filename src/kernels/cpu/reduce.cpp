// Whole-tensor reductions for scalar losses, in double over fixed chunks whose partial sums are
// added in order: the result is the same for any thread count and run (an OpenMP reduction
// clause combines in whatever order threads finish), and below one chunk it is the plain
// sequential sum.
#include <algorithm>
#include <vector>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"

namespace atl::cpu {

namespace {

constexpr int64_t kChunk = int64_t(1) << 14;

template <typename F>
double chunked_sum(int64_t n, F term) {
  const int64_t nc = (n + kChunk - 1) / kChunk;
  if (nc <= 1) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += term(i);
    return s;
  }
  std::vector<double> part(size_t(nc), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < nc; ++c) {
    double s = 0;
    const int64_t e = std::min(n, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < e; ++i) s += term(i);
    part[size_t(c)] = s;
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

}  // namespace

double sum(const float* x, int64_t n) {
  return chunked_sum(n, [x](int64_t i) { return double(x[i]); });
}

double dot(const float* x, const float* y, int64_t n) {
  return chunked_sum(n, [x, y](int64_t i) { return double(x[i]) * y[i]; });
}

double sq_diff_sum(const float* p, const float* t, int64_t n) {
  return chunked_sum(n, [p, t](int64_t i) {
    const double d = double(p[i]) - t[i];
    return d * d;
  });
}

void sq_diff_backward(float* dp, float* dt, const float* p, const float* t, int64_t n, float g) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float d = g * (p[i] - t[i]);
    if (dp) dp[i] += d;
    if (dt) dt[i] -= d;
  }
}

}  // namespace atl::cpu
