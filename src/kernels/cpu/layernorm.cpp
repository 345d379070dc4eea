// LayerNorm (Ba, Kiros & Hinton 2016) over the last dim, forward and backward as in llm.c.
// The weight/bias gradients are column sums over all rows; they are split by column blocks, each
// thread recomputing the normalised input for its columns, so no thread shares an output and the
// result does not depend on the thread count.
#include <algorithm>
#include <cmath>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if(parallel : N * C >= detail::kMinParallelWork)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = inp + i * C;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += x[c];
    const float m = s / float(C);
    float v = 0.0f;  // two-pass variance: no cancellation when |mean| >> std
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
    const float r = 1.0f / std::sqrt(v / float(C) + eps);
    float* o = out + i * C;
    if (bias) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * r * weight[c] + bias[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = (x[c] - m) * r * weight[c];
    }
    if (mean) mean[i] = m;
    if (rstd) rstd[i] = r;
  }
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C) {
  if (dinp) {
#pragma omp parallel for schedule(static) if(parallel : N * C >= detail::kMinParallelWork)
    for (int64_t i = 0; i < N; ++i) {
      const float* x = inp + i * C;
      const float* dy = dout + i * C;
      const float m = mean[i], r = rstd[i];
      // dx = r * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w.
      float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t c = 0; c < C; ++c) {
        const float g = dy[c] * weight[c];
        sg += g;
        sgx += g * (x[c] - m) * r;
      }
      sg /= float(C);
      sgx /= float(C);
      float* dx = dinp + i * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dx[c] += r * (dy[c] * weight[c] - sg - (x[c] - m) * r * sgx);
    }
  }
  if (dweight || dbias) {
    constexpr int64_t kCols = 64;
    const int64_t nblk = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if(parallel : N * C >= detail::kMinParallelWork)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t c0 = blk * kCols, c1 = std::min(C, c0 + kCols);
      float aw[kCols] = {}, ab[kCols] = {};
      for (int64_t i = 0; i < N; ++i) {
        const float* x = inp + i * C;
        const float* dy = dout + i * C;
        const float m = mean[i], r = rstd[i];
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) {
          aw[c - c0] += dy[c] * (x[c] - m) * r;
          ab[c - c0] += dy[c];
        }
      }
      for (int64_t c = c0; c < c1; ++c) {
        if (dweight) dweight[c] += aw[c - c0];
        if (dbias) dbias[c] += ab[c - c0];
      }
    }
  }
}

}  // namespace atl::cpu
