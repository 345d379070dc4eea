// fp32 gemm (all transposes, strides, alpha/beta, batched) against naive double loops, and the
// bf16 gemm (AVX-512 BF16 and portable paths) against fp32 gemm on bf16-rounded inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "kernel_test_util.h"
#include "kernels/cpu/gemm.h"

using namespace atl;
using namespace atl::test;

namespace {

// Stored operand of op(X) [rows, cols] with leading dimension ld (>= stored columns).
struct Mat {
  int64_t srows, scols, ld;
  std::vector<float> v;
};
Mat make(bool trans, int64_t rows, int64_t cols, int64_t pad, uint64_t seed) {
  Mat m{trans ? cols : rows, trans ? rows : cols, 0, {}};
  m.ld = m.scols + pad;
  m.v = randn(size_t(m.srows * m.ld), seed);
  return m;
}
double get(const Mat& m, bool trans, int64_t r, int64_t c) { return trans ? m.v[c * m.ld + r] : m.v[r * m.ld + c]; }

std::vector<double> naive(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const Mat& A, const Mat& B,
                          double beta, const std::vector<float>& C, int64_t ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += get(A, ta, i, k) * get(B, tb, k, j);
      out[i * ldc + j] = alpha * s + beta * C[i * ldc + j];
    }
  return out;
}

std::vector<bf16> to_bf16(std::vector<float>& v) {  // rounds v in place too
  std::vector<bf16> h(v.size());
  cpu::f32_to_bf16(v.data(), h.data(), int64_t(v.size()));
  cpu::bf16_to_f32(h.data(), v.data(), int64_t(v.size()));
  return h;
}

}  // namespace

TEST(Gemm, AllTransposesWithStridesMatchNaive) {
  const int64_t M = 13, N = 11, K = 9, ldc = N + 3;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    auto A = make(ta, M, K, 2, 10 + t), B = make(tb, K, N, 1, 20 + t);
    auto C = randn(size_t(M * ldc), 30 + t);
    auto ref = naive(ta, tb, M, N, K, 0.75, A, B, -0.5, C, ldc);
    cpu::gemm(ta, tb, M, N, K, 0.75f, A.v.data(), A.ld, B.v.data(), B.ld, -0.5f, C.data(), ldc);
    EXPECT_LT(rel_l2(C, ref), 1e-6) << "ta=" << ta << " tb=" << tb;
  }
}

TEST(Gemm, BatchedMatchesPerMatrix) {
  const int64_t M = 5, N = 6, K = 7, batch = 3;
  auto A = randn(batch * M * K, 40), B = randn(batch * K * N, 41);
  std::vector<float> C(batch * M * N, 0.0f), R(batch * M * N, 0.0f);
  cpu::gemm_batched(false, false, M, N, K, 1.0f, A.data(), K, M * K, B.data(), N, K * N, 0.0f, C.data(), N, M * N,
                    batch);
  for (int64_t b = 0; b < batch; ++b)
    cpu::gemm(false, false, M, N, K, 1.0f, A.data() + b * M * K, K, B.data() + b * K * N, N, 0.0f,
              R.data() + b * M * N, N);
  EXPECT_EQ(C, R);
}

TEST(GemmBf16, DetectsTheCpuFeature) {
  std::ifstream f("/proc/cpuinfo");
  std::stringstream ss;
  ss << f.rdbuf();
  const bool listed = ss.str().find("avx512_bf16") != std::string::npos;
  EXPECT_EQ(cpu::has_avx512_bf16(), listed);
}

TEST(GemmBf16, MatchesFp32GemmOnRoundedInputs) {
  // K = 1601 is odd and spans three k blocks of 768; M, N leave partial micro tiles.
  const int64_t M = 37, N = 70, K = 1601, ldc = N + 5;
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    auto A = make(ta, M, K, 3, 50 + t), B = make(tb, K, N, 2, 60 + t);
    auto Ah = to_bf16(A.v), Bh = to_bf16(B.v);
    auto C0 = randn(size_t(M * ldc), 70 + t);
    for (float beta : {0.0f, 0.5f}) {
      auto C = C0, R = C0, P = C0;
      if (beta == 0.0f) std::fill(C.begin(), C.end(), NAN);  // beta 0 must not read C
      cpu::gemm(ta, tb, M, N, K, 1.25f, A.v.data(), A.ld, B.v.data(), B.ld, beta, R.data(), ldc);
      cpu::gemm_bf16(ta, tb, M, N, K, 1.25f, Ah.data(), A.ld, Bh.data(), B.ld, beta, C.data(), ldc);
      if (beta == 0.0f) std::fill(P.begin(), P.end(), NAN);
      cpu::gemm_bf16_portable(ta, tb, M, N, K, 1.25f, Ah.data(), A.ld, Bh.data(), B.ld, beta, P.data(), ldc);
      // Compare only the M×N window: the padding between rows is the same in all three.
      std::vector<float> c, p, r;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          c.push_back(C[i * ldc + j]);
          p.push_back(P[i * ldc + j]);
          r.push_back(R[i * ldc + j]);
        }
      EXPECT_LT(rel_l2(c, r), 1e-5) << "ta=" << ta << " tb=" << tb << " beta=" << beta;
      EXPECT_LT(rel_l2(p, r), 1e-5) << "portable ta=" << ta << " tb=" << tb << " beta=" << beta;
      for (int64_t i = 0; i < M; ++i)  // columns beyond N untouched
        for (int64_t j = N; j < ldc; ++j) {
          ASSERT_TRUE(std::isnan(C[i * ldc + j]) || C[i * ldc + j] == C0[i * ldc + j]);
        }
    }
  }
}

TEST(GemmBf16, ConversionsRoundToNearestEven) {
  std::vector<float> v = randn(4099, 80, 100.0f);
  v.push_back(INFINITY);
  v.push_back(-INFINITY);
  v.push_back(NAN);
  v.push_back(1.0f + 1.0f / 256.0f);  // exact tie: rounds down to even
  v.push_back(1.0f + 3.0f / 256.0f);  // exact tie: rounds up to even
  std::vector<bf16> h(v.size());
  cpu::f32_to_bf16(v.data(), h.data(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(h[i].bits, float_to_bf16(v[i]).bits) << v[i];
  EXPECT_EQ(bf16_to_float(h[v.size() - 2]), 1.0f);
  EXPECT_EQ(bf16_to_float(h[v.size() - 1]), 1.0f + 4.0f / 256.0f);
  std::vector<float> back(v.size());
  cpu::bf16_to_f32(h.data(), back.data(), int64_t(v.size()));
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isnan(v[i])) {
      ASSERT_EQ(back[i], bf16_to_float(h[i]));
    }
  EXPECT_TRUE(std::isnan(back[v.size() - 3]));
}

TEST(GemmBf16, EmptyInnerDimensionScalesC) {
  std::vector<float> C = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  std::vector<bf16> A(1), B(1);
  cpu::gemm_bf16(false, false, 2, 3, 0, 1.0f, A.data(), 1, B.data(), 3, 0.5f, C.data(), 3);
  EXPECT_EQ(C, (std::vector<float>{0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f}));
}
