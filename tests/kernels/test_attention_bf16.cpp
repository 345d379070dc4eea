// The bf16 attention kernels (kernels/cpu/attention_bf16.h) against the fp32 kernels on the
// training's shapes, on every path of this machine that multiplies bf16 natively (AMX through
// oneDNN's batched matmul, AVX-512 BF16 through atoll's kernel per head).
//
// The bound: bf16 keeps 8 significant bits, so each rounding is off by at most u = 2^-9 relative,
// about u/sqrt(3) RMS. The output sees three independent roundings: v (≈ u/sqrt(3)), P
// (≈ u/sqrt(3)) and q, k through the scores, whose error δs ≈ sqrt(2)·|s|·u/sqrt(3) moves P by
// δs relative, so it grows with the spread of the scores (RMS ~2 here, as in a trained model's
// heads): ≈ 1.6u, in all ≈ 1.8u ≈ 3.5e-3, which is what every path measures (3.3–3.8e-3). The
// gradients add dO and dS (measured 3.6–4.6e-3). The sums are fp32 on every path, so another
// CPU's summation order moves these by ~1e-6 only; the bound 8e-3 (4u) leaves room for score
// spreads up to about twice these. The fp32 kernels compared with agree with PyTorch to ~1e-6
// (test_attention.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <string>
#include <vector>

#include "tensor/rng.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernels.h"

using namespace atl;

namespace {

double rel_l2(const float* a, const float* ref, int64_t n, int64_t stride = 1, int64_t width = 0, int64_t off = 0) {
  double e = 0, r = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (width && (i % stride < off || i % stride >= off + width)) continue;
    e += (double(a[i]) - ref[i]) * (double(a[i]) - ref[i]);
    r += double(ref[i]) * ref[i];
  }
  return std::sqrt(e / r);
}

struct AttnShape {
  const char* name;
  int64_t B, T, H, hd;
};

}  // namespace

TEST(AttentionBf16, MatchesTheFp32KernelsOnTrainingShapesOnEveryBf16Path) {
  const cpu::Isa saved = cpu::active_isa();
  int paths = 0;
  // d384's layers (B=8, T=256, 6 heads of 64), one GPT-2 124M sequence (T=1024, 12 heads of 64),
  // and sizes that are multiples of nothing (the kernels' edges).
  const AttnShape shapes[] = {{"d384 (2 of 8 sequences)", 2, 256, 6, 64}, {"gpt2 (4 of 12 heads)", 1, 1024, 4, 64}, {"odd", 3, 77, 3, 40}};
  for (cpu::Isa isa : {cpu::Isa::avx512_bf16, cpu::Isa::amx}) {
    std::string why;
    if (!cpu::isa_supported(isa, &why)) {
      std::printf("[ SKIPPED  ] bf16 attention on %s: %s\n", cpu::isa_name(isa), why.c_str());
      continue;
    }
    cpu::set_isa(isa);
    ASSERT_TRUE(cpu::attention_bf16_supported());
    ++paths;
    for (const AttnShape& s : shapes) {
      const int64_t B = s.B, T = s.T, H = s.H, hd = s.hd, C = H * hd, S = 3 * C;
      Rng rng(3, 0);
      std::vector<float> qkv(size_t(B * T * S)), dout(size_t(B * T * C));
      // Scores of spread ~2 (q, k of RMS ~1.2 each): a softmax neither flat nor one-hot.
      for (auto& v : qkv) v = 1.2f * rng.normal();
      for (auto& v : dout) v = rng.normal();
      std::vector<float> out_ref(size_t(B * T * C)), lse_ref(size_t(B * H * T)), dqkv_ref(qkv.size(), 0.5f);
      cpu::attention_forward(out_ref.data(), lse_ref.data(), qkv.data(), B, T, H, H, hd);
      cpu::attention_backward(dqkv_ref.data(), dout.data(), qkv.data(), out_ref.data(), lse_ref.data(), B, T, H, H,
                              hd);
      std::vector<bf16> packed(qkv.size());
      std::vector<float> out(out_ref.size()), lse(lse_ref.size()), dqkv(qkv.size(), 0.5f);  // both accumulate
      cpu::attention_bf16_pack(packed.data(), qkv.data(), B, T, H, hd);
      cpu::attention_bf16_forward(out.data(), lse.data(), packed.data(), B, T, H, hd);
      {  // the form that also writes the output's bf16 copy (bf16_handoff.h): same output, the cast's bits
        std::vector<float> out2(out.size()), lse2(lse.size());
        std::vector<bf16> ob(out.size()), ref(out.size());
        cpu::attention_bf16_forward(out2.data(), lse2.data(), packed.data(), B, T, H, hd, ob.data());
        cpu::f32_to_bf16(out.data(), ref.data(), int64_t(out.size()));
        ASSERT_EQ(std::memcmp(out2.data(), out.data(), out.size() * 4), 0) << s.name;
        ASSERT_EQ(std::memcmp(lse2.data(), lse.data(), lse.size() * 4), 0) << s.name;
        ASSERT_EQ(std::memcmp(ob.data(), ref.data(), ob.size() * 2), 0) << s.name;
      }
      cpu::attention_bf16_backward(dqkv.data(), dout.data(), packed.data(), lse.data(), B, T, H, hd);
      double lse_err = 0;
      for (size_t i = 0; i < lse.size(); ++i) lse_err = std::max(lse_err, double(std::fabs(lse[i] - lse_ref[i])));
      for (auto& v : dqkv) v -= 0.5f;
      for (auto& v : dqkv_ref) v -= 0.5f;
      const int64_t n = int64_t(qkv.size());
      const double e_out = rel_l2(out.data(), out_ref.data(), int64_t(out.size()));
      const double e_dq = rel_l2(dqkv.data(), dqkv_ref.data(), n, S, C, 0);
      const double e_dk = rel_l2(dqkv.data(), dqkv_ref.data(), n, S, C, C);
      const double e_dv = rel_l2(dqkv.data(), dqkv_ref.data(), n, S, C, 2 * C);
      std::printf("bf16 attention on %s, %s: rel L2 out %.2e dq %.2e dk %.2e dv %.2e, max |lse err| %.2e\n",
                  cpu::isa_name(isa), s.name, e_out, e_dq, e_dk, e_dv, lse_err);
      EXPECT_LT(e_out, 8e-3) << s.name;
      EXPECT_LT(e_dq, 8e-3) << s.name;
      EXPECT_LT(e_dk, 8e-3) << s.name;
      EXPECT_LT(e_dv, 8e-3) << s.name;
      // lse is a log of sums of exps of scores off by ~|s|·u: absolute, ~1e-2 at most at |s| ~ 5.
      EXPECT_LT(lse_err, 3e-2) << s.name;
      EXPECT_GT(e_out, 0.0) << s.name << ": nothing was rounded to bf16";
    }
  }
  cpu::set_isa(saved);
  if (paths == 0) GTEST_SKIP() << "no path with bf16 dot products on " << cpu::cpu_features().model;
}

TEST(AttentionBf16, BatchedBf16ProductsMatchOneByOneOnEveryPath) {
  // gemm_bf16_batched in every layout attention uses, against gemm_bf16 per matrix on the same
  // path: the same products and fp32 sums, so only the summation order may differ (< 1e-5).
  const cpu::Isa saved = cpu::active_isa();
  for (cpu::Isa isa : {cpu::Isa::avx2, cpu::Isa::avx512_bf16, cpu::Isa::amx}) {
    std::string why;
    if (!cpu::isa_supported(isa, &why)) {
      std::printf("[ SKIPPED  ] batched bf16 products on %s: %s\n", cpu::isa_name(isa), why.c_str());
      continue;
    }
    cpu::set_isa(isa);
    if (isa == cpu::Isa::amx)  // which oneDNN kernel attention's layouts get (a reference one would be slow)
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
          if (!(ta && tb))
            std::printf("oneDNN batched bf16 matmul ta=%d tb=%d: %s\n", ta, tb,
                        cpu::onednn_matmul_impl(ta, tb, 256, 64 + 192 * tb, 256 - 192 * tb, 32).c_str());
    const int64_t batch = 5, M = 77, N = 45, K = 67;
    Rng rng(9, 0);
    std::vector<bf16> A(size_t(batch * M * K)), Bm(size_t(batch * K * N));
    for (auto& v : A) v = float_to_bf16(rng.normal());
    for (auto& v : Bm) v = float_to_bf16(rng.normal());
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const int64_t lda = ta ? M : K, ldb = tb ? K : N;
        std::vector<float> C(size_t(batch * M * N), 1.0f), R(C.size(), 1.0f);
        cpu::gemm_bf16_batched(ta, tb, M, N, K, 0.5f, A.data(), lda, M * K, Bm.data(), ldb, K * N, 2.0f, C.data(), N,
                               M * N, batch);
        for (int64_t i = 0; i < batch; ++i)
          cpu::gemm_bf16(ta, tb, M, N, K, 0.5f, A.data() + i * M * K, lda, Bm.data() + i * K * N, ldb, 2.0f,
                         R.data() + i * M * N, N);
        double e = 0, r = 0;
        for (size_t i = 0; i < C.size(); ++i) {
          e += (double(C[i]) - R[i]) * (double(C[i]) - R[i]);
          r += double(R[i]) * R[i];
        }
        EXPECT_LT(std::sqrt(e / r), 1e-5) << cpu::isa_name(isa) << " ta=" << ta << " tb=" << tb;
      }
  }
  cpu::set_isa(saved);
}
