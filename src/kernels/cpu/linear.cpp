// Linear layer (y = x·W + b, W stored [in,out] as in GPT-2's Conv1D) forward and backward as
// three sgemm calls; llm.c's matmul_forward/backward with the BLAS doing the heavy lifting.
#include <algorithm>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N,
                    int64_t C, int64_t OC) {
  if (N == 0 || OC == 0) return;
  if (bias) {
    // Seed every row with the bias and let the gemm add onto it (beta = 1): one pass over out.
#pragma omp parallel for schedule(static) if(parallel : N * OC >= detail::kMinParallelWork)
    for (int64_t i = 0; i < N; ++i) std::copy(bias, bias + OC, out + i * OC);
  }
  gemm(false, false, N, OC, C, 1.0f, inp, C, weight, OC, bias ? 1.0f : 0.0f, out, OC);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int64_t C, int64_t OC) {
  if (dinp) gemm(false, true, N, C, OC, 1.0f, dout, OC, weight, OC, 1.0f, dinp, C);       // dout·Wᵀ
  if (dweight) gemm(true, false, C, OC, N, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);    // xᵀ·dout
  if (dbias) {
    // Column sums, split by column blocks so that each thread owns its outputs (deterministic).
    constexpr int64_t kCols = 64;
    const int64_t nblk = (OC + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if(parallel : N * OC >= detail::kMinParallelWork)
    for (int64_t blk = 0; blk < nblk; ++blk) {
      const int64_t c0 = blk * kCols, c1 = std::min(OC, c0 + kCols);
      float acc[kCols] = {};
      for (int64_t i = 0; i < N; ++i) {
        const float* row = dout + i * OC;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
      }
      for (int64_t c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
    }
  }
}

}  // namespace atl::cpu
