// Fused softmax + cross-entropy with ignored targets against a naive double-precision reference.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>

#include "core/error.h"
#include "core/threads.h"
#include "kernel_test_util.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernels.h"

using namespace atl;
using namespace atl::test;

TEST(CrossEntropy, ForwardBackwardWithIgnoredTargets) {
  const int64_t N = 6, V = 1037;
  auto logits = randn(N * V, 1, 4.0f), dl = randn(N, 2);
  std::vector<int32_t> tgt = {5, -1, 1036, 0, -100, 77};
  std::vector<float> loss(N, NAN), lse(N, NAN);
  cpu::crossentropy_forward(loss.data(), lse.data(), logits.data(), tgt.data(), N, V);
  std::vector<double> rloss(N), rlse(N), rd(N * V);
  for (int64_t i = 0; i < N; ++i) {
    double m = -INFINITY, z = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, double(logits[i * V + v]));
    for (int64_t v = 0; v < V; ++v) z += std::exp(logits[i * V + v] - m);
    rlse[i] = m + std::log(z);
    rloss[i] = tgt[i] < 0 ? 0.0 : rlse[i] - logits[i * V + tgt[i]];
    for (int64_t v = 0; v < V; ++v)
      rd[i * V + v] = tgt[i] < 0 ? 0.0 : (std::exp(logits[i * V + v] - rlse[i]) - (v == tgt[i])) * dl[i];
  }
  EXPECT_LT(rel_l2(loss, rloss), 1e-6);
  EXPECT_LT(rel_l2(lse, rlse), 1e-6);
  EXPECT_EQ(loss[1], 0.0f);
  EXPECT_EQ(loss[4], 0.0f);
  // Backward assigns (stale contents must vanish) and may run in place over the logits.
  std::vector<float> d(N * V, 7.0f);
  cpu::crossentropy_backward(d.data(), dl.data(), logits.data(), lse.data(), tgt.data(), N, V);
  EXPECT_LT(rel_l2(d, rd), 1e-6);
  for (int64_t v = 0; v < V; ++v) ASSERT_EQ(d[1 * V + v], 0.0f);
  auto inplace = logits;
  cpu::crossentropy_backward(inplace.data(), dl.data(), inplace.data(), lse.data(), tgt.data(), N, V);
  EXPECT_LT(rel_l2(inplace, rd), 1e-6);
}

TEST(CrossEntropy, FiniteDifferences) {
  const int64_t N = 3, V = 11;
  auto logits = randn(N * V, 3), dl = randn(N, 4);
  std::vector<int32_t> tgt = {3, -1, 10};
  std::vector<float> loss(N), lse(N), d(N * V);
  cpu::crossentropy_forward(loss.data(), lse.data(), logits.data(), tgt.data(), N, V);
  cpu::crossentropy_backward(d.data(), dl.data(), logits.data(), lse.data(), tgt.data(), N, V);
  auto f = [&] {
    cpu::crossentropy_forward(loss.data(), lse.data(), logits.data(), tgt.data(), N, V);
    return dot(dl, loss);
  };
  EXPECT_LT(fd_check(logits, d, f, 1e-2f, 1000), 1e-3);
}

TEST(CrossEntropy, RejectsTargetOutsideVocabulary) {
  std::vector<float> logits(4, 0.0f), loss(1), lse(1);
  std::vector<int32_t> tgt = {4};
  EXPECT_THROW(cpu::crossentropy_forward(loss.data(), lse.data(), logits.data(), tgt.data(), 1, 4), atl::Error);
}

// The bf16 head's row pass (crossentropy_rows_bf16) is only a reordering of three calls, so it
// must give their bits exactly: the losses, the log-sum-exps, the fp32 gradient left in the
// logits and its bf16 copy (f32_to_bf16's rounding), with ignored rows, an odd V and rows split
// over 1 and 2 threads.
TEST(CrossEntropy, RowsBf16IsBitwiseTheForwardBackwardAndCast) {
  const int64_t N = 67, V = 1037;
  const auto logits = randn(N * V, 3, 4.0f);
  std::vector<int32_t> tgt(N);
  for (int64_t i = 0; i < N; ++i) tgt[i] = i % 9 == 4 ? -1 : int32_t((i * 131) % V);
  const float g = 1.0f / 61.0f;
  std::vector<float> loss(N), lse(N), d(logits), gs(N, g);
  cpu::crossentropy_forward(loss.data(), lse.data(), d.data(), tgt.data(), N, V);
  cpu::crossentropy_backward(d.data(), gs.data(), d.data(), lse.data(), tgt.data(), N, V);
  std::vector<bf16> db(N * V);
  cpu::f32_to_bf16(d.data(), db.data(), N * V);
  const int saved = num_threads();
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> loss2(N, NAN), lse2(N, NAN), x(logits);
    std::vector<bf16> db2(N * V, bf16{0x7fc1});
    cpu::crossentropy_rows_bf16(loss2.data(), lse2.data(), x.data(), db2.data(), tgt.data(), g, N, V);
    for (int64_t i = 0; i < N; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(loss2[i]), std::bit_cast<uint32_t>(loss[i])) << "row " << i;
      ASSERT_EQ(std::bit_cast<uint32_t>(lse2[i]), std::bit_cast<uint32_t>(lse[i])) << "row " << i;
    }
    int64_t nonzero = 0;
    for (int64_t k = 0; k < N * V; ++k) {
      ASSERT_EQ(std::bit_cast<uint32_t>(x[k]), std::bit_cast<uint32_t>(d[k])) << "element " << k;
      ASSERT_EQ(db2[k].bits, db[k].bits) << "element " << k;
      nonzero += db[k].bits != 0;
    }
    EXPECT_GT(nonzero, N * V / 2) << threads << " threads: a gradient of zeros tests nothing";
  }
  set_num_threads(saved);
  std::vector<int32_t> bad(N, 0);
  bad[5] = int32_t(V);
  std::vector<float> x(logits);
  EXPECT_THROW(cpu::crossentropy_rows_bf16(loss.data(), lse.data(), x.data(), db.data(), bad.data(), g, N, V), Error);
}
