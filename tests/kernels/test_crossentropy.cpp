// Fused softmax + cross-entropy with ignored targets against a naive double-precision reference.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "kernel_test_util.h"
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
