// int8 × int8 → int32 matrix products, the building block for quantized communication and
// low-precision experiments. oneDNN's matmul runs them on AMX-INT8 tiles or AVX-512 VNNI
// (VPDPBUSD, with its u8×s8 operand shift compensated inside oneDNN); elsewhere plain loops,
// which are also the reference: integer sums are exact, so every path must agree bit for bit.
#include <algorithm>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"

namespace atl::cpu {

void gemm_s8_reference(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda,
                       const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc) {
#pragma omp parallel for schedule(static) if(parallel : M * N * K >= detail::kMinParallelWork * 16)
  for (int64_t i = 0; i < M; ++i) {
    int32_t* c = C + i * ldc;
    std::fill(c, c + N, 0);
    for (int64_t k = 0; k < K; ++k) {
      const int32_t a = ta ? A[k * lda + i] : A[i * lda + k];
      if (tb) {
        for (int64_t j = 0; j < N; ++j) c[j] += a * int32_t(B[j * ldb + k]);
      } else {
        const int8_t* b = B + k * ldb;
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) c[j] += a * int32_t(b[j]);
      }
    }
  }
}

const char* gemm_s8_path() {
  // oneDNN picks AMX-INT8 or VNNI itself (bounded by a path forced at start-up, see isa.cpp).
  const CpuFeatures& f = cpu_features();
  if (active_isa() >= Isa::avx512 && (f.avx512_vnni || (f.amx_int8 && f.amx_os))) return "onednn";
  return "portable";
}

void gemm_s8(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda, const int8_t* B,
             int64_t ldb, int32_t* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (gemm_s8_path()[0] == 'o') gemm_s8_onednn(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
  else gemm_s8_reference(ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
}

}  // namespace atl::cpu
