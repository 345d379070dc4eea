// Memory-bound helpers: strided row copies (concat writes each input into its column band of the
// output rows, split reads the bands back out, and each one's backward is the other with
// accumulation), fills and scaled adds. Parallel over rows or elements.
#include <algorithm>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"

namespace atl::cpu {

void copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t width,
               bool accumulate) {
#pragma omp parallel for schedule(static) if(parallel : rows * width >= detail::kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    float* d = dst + r * ld_dst;
    const float* s = src + r * ld_src;
    if (accumulate) {
#pragma omp simd
      for (int64_t i = 0; i < width; ++i) d[i] += s[i];
    } else {
      std::copy(s, s + width, d);
    }
  }
}

void fill(float* x, float v, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) x[i] = v;
}

void add_scalar(float* x, float v, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) x[i] += v;
}

void axpy(float* y, float a, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace atl::cpu
