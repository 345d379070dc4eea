// Blocked causal attention (forward, lse, backward) against a naive materialised-softmax
// reference in double, including grouped-query heads, head dims that are not a multiple of the
// vector width and sequence lengths that are not a multiple of the block; plus finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"
#include "kernels/cpu/kernels.h"

using namespace atl;
using namespace atl::test;

namespace {

struct AttnRef {
  std::vector<double> out, lse, dqkv;
};

AttnRef attention_ref(const std::vector<float>& qkv, const std::vector<float>& dout, int64_t B, int64_t T,
                      int64_t H, int64_t KV, int64_t hd) {
  const int64_t S = (H + 2 * KV) * hd, OS = H * hd, rep = H / KV;
  const double scale = 1.0 / std::sqrt(double(hd));
  AttnRef r{std::vector<double>(B * T * OS), std::vector<double>(B * H * T), std::vector<double>(qkv.size())};
  auto q = [&](int64_t b, int64_t t, int64_t h, int64_t e) { return double(qkv[(b * T + t) * S + h * hd + e]); };
  auto k = [&](int64_t b, int64_t t, int64_t g, int64_t e) { return double(qkv[(b * T + t) * S + (H + g) * hd + e]); };
  auto v = [&](int64_t b, int64_t t, int64_t g, int64_t e) {
    return double(qkv[(b * T + t) * S + (H + KV + g) * hd + e]);
  };
  std::vector<double> P(T * T), dP(T * T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / rep;
      for (int64_t i = 0; i < T; ++i) {
        double m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0;
          for (int64_t e = 0; e < hd; ++e) s += q(b, i, h, e) * k(b, j, g, e);
          P[i * T + j] = s * scale;
          m = std::max(m, s * scale);
        }
        double z = 0;
        for (int64_t j = 0; j <= i; ++j) z += std::exp(P[i * T + j] - m);
        r.lse[(b * H + h) * T + i] = m + std::log(z);
        for (int64_t j = 0; j <= i; ++j) P[i * T + j] = std::exp(P[i * T + j] - m) / z;
        for (int64_t e = 0; e < hd; ++e) {
          double o = 0;
          for (int64_t j = 0; j <= i; ++j) o += P[i * T + j] * v(b, j, g, e);
          r.out[(b * T + i) * OS + h * hd + e] = o;
        }
      }
      // Backward through the materialised softmax.
      for (int64_t i = 0; i < T; ++i) {
        const float* dO = &dout[(b * T + i) * OS + h * hd];
        double rowdot = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hd; ++e) d += dO[e] * v(b, j, g, e);
          dP[i * T + j] = d;
          rowdot += P[i * T + j] * d;
          for (int64_t e = 0; e < hd; ++e) r.dqkv[(b * T + j) * S + (H + KV + g) * hd + e] += P[i * T + j] * dO[e];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = P[i * T + j] * (dP[i * T + j] - rowdot) * scale;
          for (int64_t e = 0; e < hd; ++e) {
            r.dqkv[(b * T + i) * S + h * hd + e] += ds * k(b, j, g, e);
            r.dqkv[(b * T + j) * S + (H + g) * hd + e] += ds * q(b, i, h, e);
          }
        }
      }
    }
  return r;
}

void check_against_ref(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "B=" << B << " T=" << T << " H=" << H << " KV=" << KV << " hd=" << hd);
  const int64_t S = (H + 2 * KV) * hd;
  auto qkv = randn(B * T * S, seed, 1.5f), dout = randn(B * T * H * hd, seed + 1);
  std::vector<float> out(B * T * H * hd, NAN), lse(B * H * T, NAN);
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
  auto ref = attention_ref(qkv, dout, B, T, H, KV, hd);
  EXPECT_LT(rel_l2(out, ref.out), 1e-5);
  EXPECT_LT(rel_l2(lse, ref.lse), 1e-6);
  auto d0 = randn(qkv.size(), seed + 2);  // backward accumulates onto whatever is there
  auto dqkv = d0;
  cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, H, KV, hd);
  for (size_t i = 0; i < dqkv.size(); ++i) ref.dqkv[i] += d0[i];
  EXPECT_LT(rel_l2(dqkv, ref.dqkv), 1e-5);
  // Gradient of each part on its own (q, k, v), so one part cannot hide behind another.
  for (int part = 0; part < 3; ++part) {
    const int64_t lo = part == 0 ? 0 : part == 1 ? H * hd : (H + KV) * hd;
    const int64_t hi = part == 0 ? H * hd : part == 1 ? (H + KV) * hd : S;
    std::vector<float> a;
    std::vector<double> b;
    for (int64_t row = 0; row < B * T; ++row)
      for (int64_t c = lo; c < hi; ++c) {
        a.push_back(dqkv[row * S + c] - d0[row * S + c]);
        b.push_back(ref.dqkv[row * S + c] - d0[row * S + c]);
      }
    EXPECT_LT(rel_l2(a, b), 1e-5) << "part " << part;
  }
}

}  // namespace

TEST(Attention, GqaOddLengthMatchesNaive) { check_against_ref(2, 70, 4, 2, 20, 1); }
TEST(Attention, TwoBlocksHeadDim64MatchesNaive) { check_against_ref(1, 130, 2, 1, 64, 2); }
TEST(Attention, ShortSequenceMhaMatchesNaive) { check_against_ref(1, 3, 3, 3, 8, 3); }
TEST(Attention, WideHeadMatchesNaive) { check_against_ref(1, 65, 2, 2, 72, 4); }
TEST(Attention, SingleTokenAndGroupsOfThreeMatchNaive) {
  check_against_ref(2, 1, 2, 1, 2, 8);
  check_against_ref(3, 129, 6, 2, 16, 9);
}

TEST(Attention, FiniteDifferences) {
  const int64_t B = 1, T = 6, H = 2, KV = 1, hd = 4, S = (H + 2 * KV) * hd;
  auto qkv = randn(B * T * S, 5), wl = randn(B * T * H * hd, 6);
  std::vector<float> out(B * T * H * hd), lse(B * H * T), dqkv(qkv.size(), 0.0f);
  cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
  cpu::attention_backward(dqkv.data(), wl.data(), qkv.data(), out.data(), lse.data(), B, T, H, KV, hd);
  auto loss = [&] {
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
    return dot(wl, out);
  };
  EXPECT_LT(fd_check(qkv, dqkv, loss, 1e-2f, 1000), 2e-3);
}

TEST(Attention, CausalityFutureTokensDoNotMatter) {
  const int64_t B = 1, T = 80, H = 2, KV = 1, hd = 16, S = (H + 2 * KV) * hd;
  auto qkv = randn(B * T * S, 7);
  std::vector<float> out1(T * H * hd), out2(T * H * hd), lse(H * T);
  cpu::attention_forward(out1.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
  for (int64_t i = 50 * S; i < T * S; ++i) qkv[i] = 100.0f;  // change tokens 50..79
  cpu::attention_forward(out2.data(), lse.data(), qkv.data(), B, T, H, KV, hd);
  for (int64_t i = 0; i < 50 * H * hd; ++i) ASSERT_EQ(out1[i], out2[i]) << i;
  EXPECT_GT(rel_l2(out2, out1), 1e-2);
}
