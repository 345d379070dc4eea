// Linear and embedding kernels against naive double-precision loops and finite differences.
#include <gtest/gtest.h>

#include "kernel_test_util.h"
#include "kernels/cpu/kernels.h"

using namespace atl;
using namespace atl::test;

namespace {

std::vector<double> linear_ref(const std::vector<float>& x, const std::vector<float>& w, const float* b, int64_t N,
                               int64_t C, int64_t OC) {
  std::vector<double> y(size_t(N * OC));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b ? b[o] : 0.0;
      for (int64_t c = 0; c < C; ++c) s += double(x[i * C + c]) * w[c * OC + o];
      y[i * OC + o] = s;
    }
  return y;
}

}  // namespace

TEST(Linear, ForwardMatchesNaive) {
  const int64_t N = 7, C = 5, OC = 9;
  auto x = randn(N * C, 1), w = randn(C * OC, 2), b = randn(OC, 3);
  std::vector<float> y(N * OC, 123.0f);
  cpu::linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
  EXPECT_LT(rel_l2(y, linear_ref(x, w, b.data(), N, C, OC)), 1e-6);
  std::fill(y.begin(), y.end(), 123.0f);  // no bias: out must be overwritten, not accumulated
  cpu::linear_forward(y.data(), x.data(), w.data(), nullptr, N, C, OC);
  EXPECT_LT(rel_l2(y, linear_ref(x, w, nullptr, N, C, OC)), 1e-6);
}

TEST(Linear, BackwardAccumulatesAndMatchesNaive) {
  const int64_t N = 6, C = 7, OC = 5;
  auto x = randn(N * C, 4), w = randn(C * OC, 5), dy = randn(N * OC, 6);
  auto dx0 = randn(N * C, 7), dw0 = randn(C * OC, 8), db0 = randn(OC, 9);
  auto dx = dx0, dw = dw0, db = db0;
  cpu::linear_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), N, C, OC);
  std::vector<double> rx(dx0.begin(), dx0.end()), rw(dw0.begin(), dw0.end()), rb(db0.begin(), db0.end());
  for (int64_t i = 0; i < N; ++i)
    for (int64_t o = 0; o < OC; ++o) {
      const double g = dy[i * OC + o];
      rb[o] += g;
      for (int64_t c = 0; c < C; ++c) {
        rx[i * C + c] += g * w[c * OC + o];
        rw[c * OC + o] += g * x[i * C + c];
      }
    }
  EXPECT_LT(rel_l2(dx, rx), 1e-6);
  EXPECT_LT(rel_l2(dw, rw), 1e-6);
  EXPECT_LT(rel_l2(db, rb), 1e-6);
  // Null outputs are skipped.
  cpu::linear_backward(nullptr, nullptr, db.data(), dy.data(), x.data(), w.data(), N, C, OC);
  for (int64_t o = 0; o < OC; ++o) rb[o] += rb[o] - db0[o];
  EXPECT_LT(rel_l2(db, rb), 1e-6);
}

TEST(Linear, FiniteDifferences) {
  const int64_t N = 3, C = 4, OC = 5;
  auto x = randn(N * C, 10), w = randn(C * OC, 11), b = randn(OC, 12), wl = randn(N * OC, 13);
  std::vector<float> y(N * OC), dx(N * C, 0.0f), dw(C * OC, 0.0f), db(OC, 0.0f);
  cpu::linear_backward(dx.data(), dw.data(), db.data(), wl.data(), x.data(), w.data(), N, C, OC);
  auto loss = [&] {
    cpu::linear_forward(y.data(), x.data(), w.data(), b.data(), N, C, OC);
    return dot(wl, y);
  };
  EXPECT_LT(fd_check(x, dx, loss), 1e-3);
  EXPECT_LT(fd_check(w, dw, loss), 1e-3);
  EXPECT_LT(fd_check(b, db, loss), 1e-3);
}

TEST(Embedding, ForwardBackwardWithRepeatedTokens) {
  const int64_t B = 2, T = 5, C = 70, V = 4;  // C > 64 crosses the channel blocks of backward
  auto wte = randn(V * C, 20), wpe = randn(T * C, 21), dy = randn(B * T * C, 22);
  std::vector<int32_t> tok = {0, 3, 3, 1, 0, 3, 2, 2, 0, 3};
  std::vector<float> y(B * T * C);
  cpu::embedding_forward(y.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
  std::vector<double> ry(y.size());
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) ry[i * C + c] = double(wte[tok[i] * C + c]) + wpe[(i % T) * C + c];
  EXPECT_LT(rel_l2(y, ry), 1e-7);
  cpu::embedding_forward(y.data(), tok.data(), wte.data(), nullptr, B, T, C);
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) ry[i * C + c] = wte[tok[i] * C + c];
  EXPECT_LT(rel_l2(y, ry), 1e-7);

  auto dwte = randn(V * C, 23), dwpe = randn(T * C, 24);
  std::vector<double> rte(dwte.begin(), dwte.end()), rpe(dwpe.begin(), dwpe.end());
  cpu::embedding_backward(dwte.data(), dwpe.data(), dy.data(), tok.data(), B, T, C);
  for (int64_t i = 0; i < B * T; ++i)
    for (int64_t c = 0; c < C; ++c) {
      rte[tok[i] * C + c] += dy[i * C + c];
      rpe[(i % T) * C + c] += dy[i * C + c];
    }
  EXPECT_LT(rel_l2(dwte, rte), 1e-6);
  EXPECT_LT(rel_l2(dwpe, rpe), 1e-6);
}

TEST(Embedding, FiniteDifferences) {
  const int64_t B = 2, T = 3, C = 4, V = 3;
  auto wte = randn(V * C, 30), wpe = randn(T * C, 31), wl = randn(B * T * C, 32);
  std::vector<int32_t> tok = {2, 2, 0, 1, 2, 0};
  std::vector<float> y(B * T * C), dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
  cpu::embedding_backward(dwte.data(), dwpe.data(), wl.data(), tok.data(), B, T, C);
  auto loss = [&] {
    cpu::embedding_forward(y.data(), tok.data(), wte.data(), wpe.data(), B, T, C);
    return dot(wl, y);
  };
  EXPECT_LT(fd_check(wte, dwte, loss), 1e-3);
  EXPECT_LT(fd_check(wpe, dwpe, loss), 1e-3);
}
