// RMSNorm (Zhang & Sennrich 2019): out = x / rms(x) * w, forward and backward. Weight gradients
// are column sums split by column blocks, as in layernorm.cpp, for determinism without scratch.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                     float eps) {
#pragma omp parallel for schedule(static) if(parallel : N * C >= detail::kMinParallelWork)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
    const float r = 1.0f / std::sqrt(ss / float(C) + eps);
    float* o = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = x[c] * r * weight[c];
    if (rstd) rstd[i] = r;
  }
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int64_t C) {
  if (dinp) {
#pragma omp parallel for schedule(static) if(parallel : N * C >= detail::kMinParallelWork)
    for (int64_t i = 0; i < N; ++i) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      const float r = rstd[i];
      // dx = r * (g - xhat * mean(g * xhat)) with g = dy * w, xhat = x * r.
      float sgx = 0.0f;
#pragma omp simd reduction(+ : sgx)
      for (int64_t c = 0; c < C; ++c) sgx += dy[c] * weight[c] * x[c] * r;
      sgx /= float(C);
      float* dx = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dx[c] += r * (dy[c] * weight[c] - x[c] * r * sgx);
    }
  }
  if (dweight) {
    constexpr int64_t kCols = 64;
    const int64_t nblk = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if(parallel : N * C >= detail::kMinParallelWork)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t c0 = blk * kCols, c1 = std::min(C, c0 + kCols);
      float aw[kCols] = {};
      for (int64_t i = 0; i < N; ++i) {
        const float* x = inp + i * C;
        const float* dy = dout + i * C;
        const float r = rstd[i];
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) aw[c - c0] += dy[c] * x[c] * r;
      }
      for (int64_t c = c0; c < c1; ++c) dweight[c] += aw[c - c0];
    }
  }
}

}  // namespace atl::cpu
