// fp32 gemm with one row (M = 1, the matrix-vector path a decoding step takes) against naive
// double loops: all transposes, strides, alpha and beta, and beta = 0 over a C full of NaN (which
// must be overwritten, not propagated).
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/cpu/gemm.h"

using namespace atl;
using namespace atl::test;

TEST(GemmRow, OneRowMatchesNaiveForAllTransposes) {
  const int64_t N = 37, K = 29;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    // op(A) [1, K]: stored [1, K] (ld K+2), or [K, 1] with ld 3; op(B) [K, N]: stored [K, N] or [N, K], ld +1.
    const int64_t lda = ta ? 3 : K + 2, ldb = (tb ? K : N) + 1;
    auto A = randn(size_t(ta ? K * lda : lda), 40 + t), B = randn(size_t((tb ? N : K) * ldb), 50 + t);
    auto a = [&](int64_t k) { return double(ta ? A[size_t(k * lda)] : A[size_t(k)]); };
    auto b = [&](int64_t k, int64_t j) { return double(tb ? B[size_t(j * ldb + k)] : B[size_t(k * ldb + j)]); };
    for (float beta : {0.0f, -0.5f}) {
      std::vector<float> C = beta == 0.0f ? std::vector<float>(size_t(N), NAN) : randn(size_t(N), 60 + t);
      std::vector<double> ref(static_cast<size_t>(N));
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += a(k) * b(k, j);
        ref[size_t(j)] = 0.75 * s + (beta == 0.0f ? 0.0 : double(beta) * C[size_t(j)]);
      }
      cpu::gemm(ta, tb, 1, N, K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), N);
      for (float c : C) ASSERT_TRUE(std::isfinite(c)) << "ta=" << ta << " tb=" << tb << " beta=" << beta;
      // fp32 sums of 29 products of unit normals: a relative L2 error of a few 1e-7.
      EXPECT_LT(rel_l2(C, ref), 1e-6) << "ta=" << ta << " tb=" << tb << " beta=" << beta;
    }
  }
}
