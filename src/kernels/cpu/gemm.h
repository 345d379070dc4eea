// Dense matrix products on the CPU. fp32 goes through OpenBLAS (cblas_sgemm); bf16 inputs with
// fp32 accumulation use the AVX-512 BF16 dot-product instructions where the CPU has them.
// All matrices are row-major; ld* are row strides in elements.
#pragma once
#include <cstdint>

#include "tensor/dtype.h"

namespace atl::cpu {

// C[M,N] = alpha * op(A) · op(B) + beta * C, op(X) = X or X^T.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The same over `batch` matrices at fixed element strides.
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c, int64_t batch);

// bf16 operands, fp32 accumulation and output.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
               int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The path gemm_bf16 takes on CPUs without AVX-512 BF16 (widen to fp32, then sgemm); callable
// directly so that tests cover it on any machine.
void gemm_bf16_portable(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
                        int64_t ldc);

bool has_avx512_bf16();
void f32_to_bf16(const float* in, bf16* out, int64_t n);
void bf16_to_f32(const bf16* in, float* out, int64_t n);

}  // namespace atl::cpu
