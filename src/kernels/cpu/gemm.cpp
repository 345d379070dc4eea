// fp32 matrix products through OpenBLAS (cblas_sgemm, GotoBLAS2's descendant): row-major, with
// transposes expressed as BLAS flags so that no operand is ever copied. The BLAS takes int sizes,
// so larger matrices are rejected instead of silently wrapping.
#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <climits>

#include "core/error.h"

namespace atl::cpu {

void gemm_openblas(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                   const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  ATOLL_CHECK(M <= INT_MAX && N <= INT_MAX && K <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX,
              "gemm: sizes {}x{}x{} exceed the BLAS's 32-bit range", M, N, K);
  if (M == 1) {
    // One row (a decoding step): a matrix-vector product. sgemm would first pack all of B, which
    // for a weight matrix costs more than the product itself. beta = 0 must not read C (it may be
    // uninitialised), so C is cleared and the product added.
    if (beta == 0.0f) std::fill(C, C + N, 0.0f);
    cblas_sgemv(CblasRowMajor, tb ? CblasNoTrans : CblasTrans, int(tb ? N : K), int(tb ? K : N), alpha, B, int(ldb),
                A, ta ? int(lda) : 1, beta == 0.0f ? 1.0f : beta, C, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

void gemm_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  int64_t sa, const float* B, int64_t ldb, int64_t sb, float beta, float* C, int64_t ldc,
                  int64_t sc, int64_t batch) {
  for (int64_t i = 0; i < batch; ++i)
    gemm(ta, tb, M, N, K, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, ldc);
}

}  // namespace atl::cpu
