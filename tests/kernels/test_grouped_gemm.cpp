// The grouped GEMM of MoE layers (kernels/cpu/grouped_gemm.cpp) against a loop of one BLAS GEMM
// per group and against double-precision sums, with empty, single-row, tile-straddling and large
// groups; and its determinism: a row's result does not depend on the group sizes, on which other
// rows share its call, or on the thread count (what makes expert parallelism reproduce one rank).
//
// Tolerance 1e-5 relative L2: fp32 sums of K <= 70 terms (errors ~1e-7 for any order or FMA use,
// so for BLAS's order on any x86-64 CPU as for ours), while a row in the wrong group or a missed
// tile is off by O(1).
#include <gtest/gtest.h>
#include <omp.h>

#include <vector>

#include "kernel_test_util.h"
#include "kernels/cpu/moe_kernels.h"

using namespace atl;
using namespace atl::test;

namespace {

std::vector<int64_t> offsets_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> off{0};
  for (int64_t s : sizes) off.push_back(off.back() + s);
  return off;
}

}  // namespace

TEST(GroupedGemm, ForwardMatchesLoopOfGemmsAndBackwardMatchesDoubleSums) {
  const std::vector<int64_t> sizes = {0, 1, 17, 5, 0, 70, 3};
  const int64_t G = int64_t(sizes.size()), K = 37, N = 70;
  const auto off = offsets_of(sizes);
  const int64_t M = off.back();
  auto x = randn(size_t(M * K), 1), w = randn(size_t(G * K * N), 2, 0.2f), dy = randn(size_t(M * N), 3);
  std::vector<float> y(size_t(M * N), 7.f), yl(size_t(M * N));
  cpu::grouped_gemm_forward(y.data(), x.data(), w.data(), off.data(), G, K, N);
  cpu::grouped_gemm_loop(yl.data(), x.data(), w.data(), off.data(), G, K, N);
  EXPECT_LT(rel_l2(y, yl), 1e-5);

  std::vector<float> dx(size_t(M * K), 0.5f), dw(size_t(G * K * N), -0.25f);
  cpu::grouped_gemm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), off.data(), G, K, N);
  std::vector<double> rdx(size_t(M * K), 0.5), rdw(size_t(G * K * N), -0.25);
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = off[size_t(g)]; r < off[size_t(g + 1)]; ++r)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n) {
          const double wv = w[size_t((g * K + k) * N + n)], d = dy[size_t(r * N + n)];
          rdx[size_t(r * K + k)] += d * wv;
          rdw[size_t((g * K + k) * N + n)] += double(x[size_t(r * K + k)]) * d;
        }
  EXPECT_LT(rel_l2(dx, rdx), 1e-5);
  EXPECT_LT(rel_l2(dw, rdw), 1e-5);
  // Empty groups leave their weight gradient as it was (accumulate, never overwrite).
  for (int64_t i = 0; i < K * N; ++i) ASSERT_EQ(dw[size_t(i)], -0.25f);
}

TEST(GroupedGemm, ARowsResultIsBitIdenticalWhateverItsGroupAndThreads) {
  const int64_t K = 29, N = 67, M = 40;
  auto x = randn(size_t(M * K), 4), w = randn(size_t(K * N), 5, 0.3f);
  // One group of 40 rows on one thread, against the same rows split into groups of 3, 20 and 17
  // (all using the same weight) on every thread.
  std::vector<float> w3;
  for (int i = 0; i < 3; ++i) w3.insert(w3.end(), w.begin(), w.end());
  std::vector<float> a(size_t(M * N)), b(size_t(M * N));
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<int64_t> one = {0, M};
  cpu::grouped_gemm_forward(a.data(), x.data(), w.data(), one.data(), 1, K, N);
  omp_set_num_threads(std::max(2, threads));
  const auto three = offsets_of({3, 20, 17});
  cpu::grouped_gemm_forward(b.data(), x.data(), w3.data(), three.data(), 3, K, N);
  omp_set_num_threads(threads);
  for (int64_t i = 0; i < M * N; ++i) ASSERT_EQ(a[size_t(i)], b[size_t(i)]) << "element " << i;
}
