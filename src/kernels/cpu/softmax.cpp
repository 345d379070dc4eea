// Row softmax and log-softmax over the last dim, max-subtracted for range (exp of a non-positive
// argument never overflows). Backward from the saved output: softmax dx = y ∘ (dy - Σ dy∘y),
// log-softmax dx = dy - exp(y) Σ dy.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"

namespace atl::cpu {

void softmax_forward(float* y, const float* x, int64_t N, int64_t C, bool log) {
#pragma omp parallel for schedule(static) if(parallel : N * C >= detail::kMinParallelWork)
  for (int64_t i = 0; i < N; ++i) {
    const float* xi = x + i * C;
    float* yi = y + i * C;
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t c = 0; c < C; ++c) m = xi[c] > m ? xi[c] : m;
    const float s = detail::exp_sum_seq(yi, xi, C, m);  // in index order (kernel_util.h)
    if (log) {
      const float l = m + std::log(s);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yi[c] = xi[c] - l;
    } else {
      const float inv = 1.0f / s;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yi[c] *= inv;
    }
  }
}

void softmax_backward(float* dx, const float* dy, const float* y, int64_t N, int64_t C, bool log) {
#pragma omp parallel for schedule(static) if(parallel : N * C >= detail::kMinParallelWork)
  for (int64_t i = 0; i < N; ++i) {
    const float* yi = y + i * C;
    const float* gi = dy + i * C;
    float* di = dx + i * C;
    float s = 0.0f;
    if (log) {
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += gi[c];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) di[c] += gi[c] - detail::exp_approx(yi[c]) * s;
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < C; ++c) s += gi[c] * yi[c];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) di[c] += yi[c] * (gi[c] - s);
    }
  }
}

}  // namespace atl::cpu
