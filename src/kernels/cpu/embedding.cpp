// Token + learned position embedding (GPT-2): out = wte[token] + wpe[t]. The backward scatter
// would race when a token repeats, so it is split by channel blocks instead of by rows.
#include <algorithm>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B,
                       int64_t T, int64_t C) {
#pragma omp parallel for schedule(static) if(parallel : B * T * C >= detail::kMinParallelWork)
  for (int64_t i = 0; i < B * T; ++i) {
    const float* e = wte + int64_t(tokens[i]) * C;
    float* o = out + i * C;
    if (wpe) {
      const float* p = wpe + (i % T) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
    } else {
      std::copy(e, e + C, o);
    }
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B,
                        int64_t T, int64_t C) {
  constexpr int64_t kCols = 64;
  const int64_t nblk = (C + kCols - 1) / kCols;
  if (dwte) {
#pragma omp parallel for schedule(static) if(parallel : B * T * C >= detail::kMinParallelWork)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t c0 = blk * kCols, c1 = std::min(C, c0 + kCols);
      for (int64_t i = 0; i < B * T; ++i) {
        float* e = dwte + int64_t(tokens[i]) * C;
        const float* d = dout + i * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) e[c] += d[c];
      }
    }
  }
  if (dwpe) {
#pragma omp parallel for schedule(static) if(parallel : B * T * C >= detail::kMinParallelWork)
    for (int64_t t = 0; t < T; ++t) {
      float* p = dwpe + t * C;
      for (int64_t b = 0; b < B; ++b) {
        const float* d = dout + (b * T + t) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) p[c] += d[c];
      }
    }
  }
}

}  // namespace atl::cpu
