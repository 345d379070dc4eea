// Index kernels for gather, index_select, scatter-add and segment-sum (the sparse aggregation of
// message-passing networks, Gilmer et al. 2017). Tensors are viewed as [O, N, I] around the
// indexed dim. Gathers parallelise over output rows; scatters would race when an index repeats,
// so each thread owns a block of the inner columns instead and walks every index in order, which
// also makes the sums deterministic for any thread count.
#include <algorithm>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"

namespace atl::cpu {

namespace {
constexpr int64_t kCols = 64;
}

void gather_rows(float* out, const float* x, const int32_t* idx, int64_t O, int64_t N, int64_t M, int64_t I) {
#pragma omp parallel for schedule(static) if(parallel : O * M * I >= detail::kMinParallelWork)
  for (int64_t r = 0; r < O * M; ++r) {
    const int64_t o = r / M, m = r % M;
    const float* src = x + (o * N + idx[m]) * I;
    float* dst = out + r * I;
#pragma omp simd
    for (int64_t i = 0; i < I; ++i) dst[i] += src[i];
  }
}

void scatter_rows(float* out, const float* src, const int32_t* idx, int64_t O, int64_t N, int64_t M, int64_t I) {
  const int64_t nblk = (I + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if(parallel : O * M * I >= detail::kMinParallelWork)
  for (int64_t t = 0; t < O * nblk; ++t) {
    const int64_t o = t / nblk, c0 = (t % nblk) * kCols, c1 = std::min(I, c0 + kCols);
    for (int64_t m = 0; m < M; ++m) {
      float* dst = out + (o * N + idx[m]) * I;
      const float* s = src + (o * M + m) * I;
#pragma omp simd
      for (int64_t i = c0; i < c1; ++i) dst[i] += s[i];
    }
  }
}

void gather_elems(float* out, const float* x, const int32_t* idx, int64_t O, int64_t N, int64_t K, int64_t I) {
#pragma omp parallel for schedule(static) if(parallel : O * K * I >= detail::kMinParallelWork)
  for (int64_t r = 0; r < O * K; ++r) {
    const int64_t o = r / K;
    const int32_t* ix = idx + r * I;
    float* dst = out + r * I;
    const float* base = x + o * N * I;
    for (int64_t i = 0; i < I; ++i) dst[i] += base[int64_t(ix[i]) * I + i];
  }
}

void scatter_elems(float* out, const float* src, const int32_t* idx, int64_t O, int64_t N, int64_t K, int64_t I) {
  const int64_t nblk = (I + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if(parallel : O * K * I >= detail::kMinParallelWork)
  for (int64_t t = 0; t < O * nblk; ++t) {
    const int64_t o = t / nblk, c0 = (t % nblk) * kCols, c1 = std::min(I, c0 + kCols);
    float* base = out + o * N * I;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t* ix = idx + (o * K + k) * I;
      const float* s = src + (o * K + k) * I;
      for (int64_t i = c0; i < c1; ++i) base[int64_t(ix[i]) * I + i] += s[i];
    }
  }
}

}  // namespace atl::cpu
