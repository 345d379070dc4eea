// The exp row sums of softmax and cross-entropy (kernel_util.h's exp_sum_seq) in their documented
// order (index order, as the scalar loops had), so that a row gives the same bits wherever it sits
// in memory and the same as before the exps were vectorised: the
// tensor-parallel, pipeline and context-parallel tests assert bit-identity with one rank, and their
// shards hold the same rows at other addresses. An `omp simd reduction` may peel iterations to
// align a pointer, which is what these tests would catch (offsets 0..15 floats cover every
// alignment of a 64-byte vector). Also: the vectorised exp_approx gives the scalar one's bits.
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/op_set.h"
#include "kernel_test_util.h"

using namespace atl;
using cpu::detail::exp_approx;
using cpu::detail::exp_sum_seq;

namespace {

__attribute__((noinline)) float scalar_exp(float x) { return exp_approx(x); }

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

}  // namespace

TEST(FixedOrderSums, FollowTheDocumentedOrder) {
  for (size_t n : {0, 1, 15, 16, 17, 31, 33, 257, 1000}) {
    auto x = test::randn(n, 7 + n, 3.0f);
    float seq = 0.0f;
    std::vector<float> e(n), y(n);
    for (size_t i = 0; i < n; ++i) seq += (e[i] = scalar_exp(x[i] - 0.25f));
    EXPECT_EQ(std::bit_cast<uint32_t>(exp_sum_seq(y.data(), x.data(), int64_t(n), 0.25f)), std::bit_cast<uint32_t>(seq))
        << "n=" << n;
    EXPECT_TRUE(same_bits(y.data(), e.data(), n)) << "n=" << n;
    EXPECT_EQ(std::bit_cast<uint32_t>(exp_sum_seq(nullptr, x.data(), int64_t(n), 0.25f)), std::bit_cast<uint32_t>(seq))
        << "n=" << n;
  }
  // A tree-ordered sum rounds differently here, so the test can tell the orders apart.
  auto x = test::randn(1000, 3, 3.0f);
  float seq = 0.0f, lane[16] = {};
  for (size_t i = 0; i < x.size(); ++i) {
    seq += scalar_exp(x[i]);
    lane[i % 16] += scalar_exp(x[i]);
  }
  float tree = 0.0f;
  for (float l : lane) tree += l;
  EXPECT_NE(std::bit_cast<uint32_t>(seq), std::bit_cast<uint32_t>(tree));
}

TEST(FixedOrderSums, VectorisedExpGivesTheScalarBits) {
  auto x = test::randn(4096 + 16, 11, 30.0f);  // reaches both clamps
  x[5] = -INFINITY;
  x[6] = INFINITY;
  x[7] = -0.0f;
  std::vector<float> y(x.size());
  for (int off = 0; off < 16; ++off) {
    const int64_t n = 4096;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[off + i] = exp_approx(x[off + i]);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(y[off + i]), std::bit_cast<uint32_t>(scalar_exp(x[off + i])))
          << "x=" << x[off + i] << " offset " << off;
  }
}

TEST(FixedOrderSums, SoftmaxAndCrossEntropyIndependentOfAddress) {
  const int64_t N = 3, C = 1000, V = 5000;  // V spans three of cross-entropy's 2048 chunks
  auto x = test::randn(N * V, 5, 2.0f), dy = test::randn(N * V, 6);
  auto tgt = test::randint(N, 0, int32_t(V), 8);
  std::vector<float> src(N * V + 16), g(N * V + 16), y(N * V + 16), dx(N * V + 16);
  std::vector<float> y0, dx0, loss0, lse0, es0;
  for (bool log : {false, true}) {
    for (int off = 0; off < 16; ++off) {
      std::memcpy(src.data() + off, x.data(), N * C * sizeof(float));
      std::memcpy(g.data() + off, dy.data(), N * C * sizeof(float));
      std::fill(dx.begin(), dx.end(), 0.0f);
      cpu::softmax_forward(y.data() + off, src.data() + off, N, C, log);
      cpu::softmax_backward(dx.data() + off, g.data() + off, y.data() + off, N, C, log);
      if (off == 0) {
        y0.assign(y.begin(), y.begin() + N * C);
        dx0.assign(dx.begin(), dx.begin() + N * C);
        continue;
      }
      EXPECT_TRUE(same_bits(y.data() + off, y0.data(), size_t(N * C))) << "softmax log=" << log << " offset " << off;
      EXPECT_TRUE(same_bits(dx.data() + off, dx0.data(), size_t(N * C))) << "softmax backward log=" << log
                                                                        << " offset " << off;
    }
  }
  std::vector<float> loss(N), lse(N), es(N);
  for (int off = 0; off < 16; ++off) {
    std::memcpy(src.data() + off, x.data(), N * V * sizeof(float));
    cpu::crossentropy_forward(loss.data(), lse.data(), src.data() + off, tgt.data(), N, V);
    for (int64_t i = 0; i < N; ++i) es[i] = exp_sum_seq(nullptr, src.data() + off + i * V, V, 0.5f);
    if (off == 0) {
      loss0 = loss, lse0 = lse, es0 = es;
      continue;
    }
    EXPECT_TRUE(same_bits(loss.data(), loss0.data(), size_t(N))) << "cross-entropy offset " << off;
    EXPECT_TRUE(same_bits(lse.data(), lse0.data(), size_t(N))) << "cross-entropy offset " << off;
    EXPECT_TRUE(same_bits(es.data(), es0.data(), size_t(N))) << "exp_sum_seq offset " << off;
  }
}
