// Every CPU attention kernel (causal forward/backward, ranged, ring block, cached) on each of its
// ISA variants (kernels/cpu/attention_variants.h: AVX2 and AVX-512, chosen by the active path),
// against a masked softmax in double. Each path the CPU supports is forced with set_isa, the way
// hardware.isa / ATOLL_ISA force it; a path the CPU lacks is skipped with the reason printed.
//
// Tolerances: the kernels sum in fp32 (dot products over hd, softmax sums and P·V over up to T
// keys) and use exp_approx (about 1 ulp), so against a double reference the relative L2 error is
// a few times fp32's 6e-8 times the square root of the summation length: below 1e-6 at these
// sizes. The bounds (1e-5; 1e-6 for the lse, a log of a sum of positive terms) are the ones
// tests/kernels/test_attention.cpp states for the causal kernel, and they do not depend on the CPU:
// the AVX2 and AVX-512 variants perform the same fp32 operations and differ only in how an
// dot product (or a vectorised softmax sum) splits into 8 or 16 partial sums, which moves results by a few
// ulps, far inside them (the cross-variant check below bounds that at 1e-6; which code each
// variant runs is fixed when the binary is built, so that difference does not depend on the CPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "kernel_test_util.h"
#include "kernels/cpu/attention_paths.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/op_set.h"

using namespace atl;
using namespace atl::test;
using cpu::Isa;

namespace {

struct Shape {
  int64_t B, T, H, KV, hd;
};
// Odd head dim (padded operands), two blocks at hd 64, a head dim whose padded width is not a
// multiple of either variant's tile width (72 -> 80), groups of three query heads per kv head.
const Shape kShapes[] = {{2, 70, 4, 2, 20}, {1, 130, 2, 1, 64}, {1, 65, 2, 2, 72}, {2, 129, 6, 2, 16}};

// Visible key ranges: causal, or causal within documents (packed sequences) when docs is set.
struct Ranges {
  std::vector<int32_t> k_lo, k_hi, q_lo, q_hi;
  kernels::AttentionRanges view() const { return {k_lo.data(), k_hi.data(), q_lo.data(), q_hi.data()}; }
};
Ranges make_ranges(int64_t B, int64_t T, bool docs) {
  Ranges r;
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> start(T, 0), end(T, int32_t(T));
    if (docs) {  // documents of 1, 9, 23, 2, ... tokens, different per row
      int64_t s = 0, n = 1 + b;
      while (s < T) {
        const int64_t e = std::min<int64_t>(T, s + n);
        for (int64_t t = s; t < e; ++t) start[t] = int32_t(s), end[t] = int32_t(e);
        s = e;
        n = (n * 7 + 2) % 29 + 1;
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      r.k_lo.push_back(start[t]);
      r.k_hi.push_back(int32_t(t + 1));
      r.q_lo.push_back(int32_t(t));
      r.q_hi.push_back(end[t]);
    }
  }
  return r;
}

struct Ref {
  std::vector<double> out, lse, dqkv;
};

// Materialised softmax in double over the visible ranges; dqkv in qkv's layout.
Ref reference(const std::vector<float>& qkv, const std::vector<float>& dout, const Ranges& rg, const Shape& s) {
  const int64_t S = (s.H + 2 * s.KV) * s.hd, OS = s.H * s.hd, rep = s.H / s.KV, hd = s.hd, T = s.T;
  const double scale = 1.0 / std::sqrt(double(hd));
  Ref r{std::vector<double>(s.B * T * OS), std::vector<double>(s.B * s.H * T), std::vector<double>(qkv.size())};
  std::vector<double> P(T), dP(T);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const int64_t g = h / rep, lo = rg.k_lo[b * T + i], hi = rg.k_hi[b * T + i];
        const float* q = &qkv[(b * T + i) * S + h * hd];
        const float* dO = &dout[(b * T + i) * OS + h * hd];
        auto k = [&](int64_t j) { return &qkv[(b * T + j) * S + (s.H + g) * hd]; };
        auto v = [&](int64_t j) { return &qkv[(b * T + j) * S + (s.H + s.KV + g) * hd]; };
        double m = -INFINITY;
        for (int64_t j = lo; j < hi; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hd; ++e) d += double(q[e]) * k(j)[e];
          P[j] = d * scale;
          m = std::max(m, P[j]);
        }
        double z = 0;
        for (int64_t j = lo; j < hi; ++j) z += std::exp(P[j] - m);
        r.lse[(b * s.H + h) * T + i] = m + std::log(z);
        double rowdot = 0;
        for (int64_t j = lo; j < hi; ++j) {
          P[j] = std::exp(P[j] - m) / z;
          double d = 0;
          for (int64_t e = 0; e < hd; ++e) d += double(dO[e]) * v(j)[e];
          dP[j] = d;
          rowdot += P[j] * d;
          for (int64_t e = 0; e < hd; ++e) {
            r.out[(b * T + i) * OS + h * hd + e] += P[j] * v(j)[e];
            r.dqkv[(b * T + j) * S + (s.H + s.KV + g) * hd + e] += P[j] * dO[e];
          }
        }
        for (int64_t j = lo; j < hi; ++j) {
          const double ds = P[j] * (dP[j] - rowdot) * scale;
          for (int64_t e = 0; e < hd; ++e) {
            r.dqkv[(b * T + i) * S + h * hd + e] += ds * k(j)[e];
            r.dqkv[(b * T + j) * S + (s.H + g) * hd + e] += ds * q[e];
          }
        }
      }
  return r;
}

// Columns [lo, hi) of every row of a [rows, width] buffer.
template <typename V>
V columns(const V& x, int64_t width, int64_t lo, int64_t hi) {
  V out;
  for (size_t row = 0; row < x.size() / size_t(width); ++row)
    for (int64_t c = lo; c < hi; ++c) out.push_back(x[row * width + c]);
  return out;
}

// Checks a gradient in qkv layout part by part (q, k, v), so one part cannot hide behind another.
template <typename A, typename B>
void expect_qkv_close(const A& got, const B& ref, const Shape& s, double tol, const char* what) {
  const int64_t S = (s.H + 2 * s.KV) * s.hd;
  const int64_t cut[4] = {0, s.H * s.hd, (s.H + s.KV) * s.hd, S};
  for (int part = 0; part < 3; ++part)
    EXPECT_LT(rel_l2(columns(got, S, cut[part], cut[part + 1]), columns(ref, S, cut[part], cut[part + 1])), tol)
        << what << " part " << "qkv"[part];
}

// Every kernel's results on one shape, through the dispatching entry points.
struct Results {
  std::vector<float> causal_out, causal_lse, causal_dqkv, ranged_out, ranged_lse, ranged_dqkv, block_out,
      block_lse, block_dq, block_dkv, block_dkv_alone, cached_out;
};

Results run_all(const Shape& s, uint64_t seed) {
  const int64_t S = (s.H + 2 * s.KV) * s.hd, OS = s.H * s.hd, W = s.KV * s.hd, B = s.B, T = s.T;
  const auto qkv = randn(B * T * S, seed, 1.5f), dout = randn(B * T * OS, seed + 1);
  const Ranges docs = make_ranges(B, T, true);
  Results r;
  r.causal_out.assign(B * T * OS, NAN);
  r.causal_lse.assign(B * s.H * T, NAN);
  r.causal_dqkv.assign(qkv.size(), 0.0f);
  cpu::attention_forward(r.causal_out.data(), r.causal_lse.data(), qkv.data(), B, T, s.H, s.KV, s.hd);
  cpu::attention_backward(r.causal_dqkv.data(), dout.data(), qkv.data(), r.causal_out.data(), r.causal_lse.data(), B,
                          T, s.H, s.KV, s.hd);

  r.ranged_out.assign(B * T * OS, NAN);
  r.ranged_lse.assign(B * s.H * T, NAN);
  r.ranged_dqkv.assign(qkv.size(), 0.0f);
  cpu::attention_ranged_forward(r.ranged_out.data(), r.ranged_lse.data(), qkv.data(), docs.view(), B, T, s.H, s.KV,
                                s.hd);
  cpu::attention_ranged_backward(r.ranged_dqkv.data(), dout.data(), qkv.data(), r.ranged_out.data(),
                                 r.ranged_lse.data(), docs.view(), B, T, s.H, s.KV, s.hd);

  // One ring block holding the whole row: its lse is already the merged one.
  std::vector<float> kv(B * T * 2 * W);
  for (int64_t row = 0; row < B * T; ++row)
    for (int64_t c = 0; c < 2 * W; ++c) kv[row * 2 * W + c] = qkv[row * S + OS + c];
  r.block_out.assign(B * T * OS, NAN);
  r.block_lse.assign(B * s.H * T, NAN);
  cpu::attention_block_forward(r.block_out.data(), r.block_lse.data(), qkv.data(), S, kv.data(), docs.view(), B, T, T,
                               s.H, s.KV, s.hd);
  std::vector<float> D(B * s.H * T);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < s.H; ++h) {
        double d = 0;
        for (int64_t e = 0; e < s.hd; ++e)
          d += double(dout[(b * T + t) * OS + h * s.hd + e]) * r.block_out[(b * T + t) * OS + h * s.hd + e];
        D[(b * s.H + h) * T + t] = float(d);
      }
  r.block_dq.assign(qkv.size(), 0.0f);
  r.block_dkv.assign(kv.size(), 0.0f);
  cpu::attention_block_backward(r.block_dq.data(), r.block_dkv.data(), dout.data(), D.data(), r.block_lse.data(),
                                qkv.data(), S, kv.data(), docs.view(), B, T, T, s.H, s.KV, s.hd);
  // Without dQ the dK/dV pass computes every pair's P and dS itself (dot_row per key) instead of
  // reading what the dQ pass stored (dot products kLanes keys at a time): the bits must agree.
  r.block_dkv_alone.assign(kv.size(), 0.0f);
  cpu::attention_block_backward(nullptr, r.block_dkv_alone.data(), dout.data(), D.data(), r.block_lse.data(),
                                qkv.data(), S, kv.data(), docs.view(), B, T, T, s.H, s.KV, s.hd);

  // Cached: row 0 as a prefill of all its positions, every other row as a decode of its last 3
  // (their keys and values for every earlier position in the cache).
  std::vector<std::vector<float>> kc(B), vc(B);
  std::vector<cpu::CachedAttentionSpan> spans;
  std::vector<float> qrows;
  int64_t first = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < W; ++c) {
        kc[b].push_back(qkv[(b * T + t) * S + OS + c]);
        vc[b].push_back(qkv[(b * T + t) * S + OS + W + c]);
      }
    const int64_t start = b == 0 ? 0 : std::max<int64_t>(0, T - 3);
    spans.push_back({kc[b].data(), vc[b].data(), start, T - start, first});
    first += T - start;
    qrows.insert(qrows.end(), qkv.begin() + (b * T + start) * S, qkv.begin() + (b * T + T) * S);
  }
  r.cached_out.assign(first * OS, NAN);
  cpu::attention_cached_forward(r.cached_out.data(), qrows.data(), spans.data(), int64_t(spans.size()), s.H, s.KV,
                                s.hd);
  return r;
}

void check_against_reference(const Results& r, const Shape& s, uint64_t seed) {
  const int64_t S = (s.H + 2 * s.KV) * s.hd, OS = s.H * s.hd, W = s.KV * s.hd, B = s.B, T = s.T;
  const auto qkv = randn(B * T * S, seed, 1.5f), dout = randn(B * T * OS, seed + 1);
  const Ref causal = reference(qkv, dout, make_ranges(B, T, false), s);
  const Ref docs = reference(qkv, dout, make_ranges(B, T, true), s);
  EXPECT_LT(rel_l2(r.causal_out, causal.out), 1e-5);
  EXPECT_LT(rel_l2(r.causal_lse, causal.lse), 1e-6);
  expect_qkv_close(r.causal_dqkv, causal.dqkv, s, 1e-5, "causal dqkv");

  EXPECT_LT(rel_l2(r.ranged_out, docs.out), 1e-5);
  EXPECT_LT(rel_l2(r.ranged_lse, docs.lse), 1e-6);
  expect_qkv_close(r.ranged_dqkv, docs.dqkv, s, 1e-5, "ranged dqkv");

  EXPECT_LT(rel_l2(r.block_out, docs.out), 1e-5);
  EXPECT_LT(rel_l2(r.block_lse, docs.lse), 1e-6);
  EXPECT_LT(rel_l2(columns(r.block_dq, S, 0, OS), columns(docs.dqkv, S, 0, OS)), 1e-5) << "block dq";
  EXPECT_LT(rel_l2(columns(r.block_dkv, 2 * W, 0, W), columns(docs.dqkv, S, OS, OS + W)), 1e-5) << "block dk";
  EXPECT_LT(rel_l2(columns(r.block_dkv, 2 * W, W, 2 * W), columns(docs.dqkv, S, OS + W, S)), 1e-5) << "block dv";

  std::vector<double> want;  // the cached spans' rows of the causal output
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = b == 0 ? 0 : std::max<int64_t>(0, T - 3);
    want.insert(want.end(), causal.out.begin() + (b * T + start) * OS, causal.out.begin() + (b * T + T) * OS);
  }
  EXPECT_LT(rel_l2(r.cached_out, want), 1e-5);
}

// The paths to run: AVX2 and AVX-512 select the two variants; the paths above avx512 run the
// AVX-512 variant too (their only difference is the bf16 GEMM).
std::vector<Isa> variant_paths() {
  std::vector<Isa> v;
  for (Isa i : {Isa::avx2, Isa::avx512}) {
    std::string why;
    if (cpu::isa_supported(i, &why)) v.push_back(i);
    else std::printf("[ SKIPPED  ] %s path: %s\n", cpu::isa_name(i), why.c_str());
  }
  return v;
}

}  // namespace

TEST(AttentionPaths, EveryKernelMatchesTheReferenceOnEverySupportedPath) {
  const Isa saved = cpu::active_isa();
  const auto paths = variant_paths();
  ASSERT_FALSE(paths.empty()) << "atoll needs at least AVX2";
  for (Isa i : paths) {
    cpu::set_isa(i);
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(testing::Message() << cpu::isa_name(i) << " B=" << s.B << " T=" << s.T << " H=" << s.H
                                      << " KV=" << s.KV << " hd=" << s.hd);
      check_against_reference(run_all(s, uint64_t(s.T + s.hd)), s, uint64_t(s.T + s.hd));
    }
  }
  cpu::set_isa(saved);
}

// The ring block kernels read the block's keys transposed and take kLanes dot products at a time
// (kernels/cpu/attention_block.inc), in dot_row's order: over a block holding the whole row they
// give the row-wise ranged kernel's bits (the same dot products, softmax and P·V), and the dK/dV
// pass gives the same bits whether it reads the dQ pass's P and dS or recomputes them per key.
// Exact equality: context parallelism's parity tests were tuned on the row-wise order.
TEST(AttentionPaths, RingBlockKernelsKeepTheRowWiseBits) {
  const Isa saved = cpu::active_isa();
  for (Isa i : variant_paths()) {
    cpu::set_isa(i);
    for (const Shape& s : kShapes) {
      SCOPED_TRACE(testing::Message() << cpu::isa_name(i) << " T=" << s.T << " hd=" << s.hd);
      const Results r = run_all(s, uint64_t(s.T + s.hd));
      EXPECT_EQ(r.block_out, r.ranged_out);
      EXPECT_EQ(r.block_lse, r.ranged_lse);
      EXPECT_EQ(r.block_dkv, r.block_dkv_alone);
    }
  }
  cpu::set_isa(saved);
}

// The active path really selects the variant: each entry point gives the bits of the variant it
// should dispatch to, called directly. Then the two variants agree with each other to 1e-6
// (reductions split into 8 or 16 partial sums: a few ulps, see the first comment).
TEST(AttentionPaths, ThePathSelectsTheVariantAndTheVariantsAgree) {
  if (!cpu::isa_supported(Isa::avx512)) GTEST_SKIP() << "no AVX-512 on " << cpu::cpu_features().model << ": one variant";
  const Isa saved = cpu::active_isa();
  const Shape s{2, 70, 4, 2, 20};
  const int64_t S = (s.H + 2 * s.KV) * s.hd, OS = s.H * s.hd;
  const auto qkv = randn(s.B * s.T * S, 11, 1.5f), dout = randn(s.B * s.T * OS, 12);
  const Ranges docs = make_ranges(s.B, s.T, true);
  Results by_path[2];
  for (int v = 0; v < 2; ++v) {
    const Isa isa = v == 0 ? Isa::avx2 : Isa::avx512;
    SCOPED_TRACE(cpu::isa_name(isa));
    cpu::set_isa(isa);
    by_path[v] = run_all(s, 90);
    const auto causal_fwd = v == 0 ? cpu::attn_avx2::causal_forward : cpu::attn_avx512::causal_forward;
    const auto causal_bwd = v == 0 ? cpu::attn_avx2::causal_backward : cpu::attn_avx512::causal_backward;
    const auto ranged_bwd = v == 0 ? cpu::attn_avx2::ranged_backward : cpu::attn_avx512::ranged_backward;
    const auto block_fwd = v == 0 ? cpu::attn_avx2::block_forward : cpu::attn_avx512::block_forward;
    std::vector<float> out(s.B * s.T * OS), lse(s.B * s.H * s.T), d1(qkv.size(), 0.0f), d2(qkv.size(), 0.0f);
    std::vector<float> out2(out.size()), lse2(lse.size()), kv(s.B * s.T * 2 * s.KV * s.hd, 0.5f);
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.H, s.KV, s.hd);
    causal_fwd(out2.data(), lse2.data(), qkv.data(), s.B, s.T, s.H, s.KV, s.hd);
    EXPECT_EQ(out, out2);
    EXPECT_EQ(lse, lse2);
    cpu::attention_backward(d1.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.H, s.KV, s.hd);
    causal_bwd(d2.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.H, s.KV, s.hd);
    EXPECT_EQ(d1, d2);
    std::fill(d1.begin(), d1.end(), 0.0f);
    std::fill(d2.begin(), d2.end(), 0.0f);
    cpu::attention_ranged_backward(d1.data(), dout.data(), qkv.data(), out.data(), lse.data(), docs.view(), s.B, s.T,
                                   s.H, s.KV, s.hd);
    ranged_bwd(d2.data(), dout.data(), qkv.data(), out.data(), lse.data(), docs.view(), s.B, s.T, s.H, s.KV, s.hd);
    EXPECT_EQ(d1, d2);
    cpu::attention_block_forward(out.data(), lse.data(), qkv.data(), S, kv.data(), docs.view(), s.B, s.T, s.T, s.H,
                                 s.KV, s.hd);
    block_fwd(out2.data(), lse2.data(), qkv.data(), S, kv.data(), docs.view(), s.B, s.T, s.T, s.H, s.KV, s.hd);
    EXPECT_EQ(out, out2);
  }
  cpu::set_isa(saved);
  const Results& a = by_path[0];
  const Results& b = by_path[1];
  const char* names[] = {"causal out", "causal lse", "causal dqkv", "ranged out", "ranged dqkv",
                         "block out",  "block dq",   "block dkv",   "cached out"};
  const std::vector<float>* av[] = {&a.causal_out, &a.causal_lse, &a.causal_dqkv, &a.ranged_out, &a.ranged_dqkv,
                                    &a.block_out,  &a.block_dq,   &a.block_dkv,   &a.cached_out};
  const std::vector<float>* bv[] = {&b.causal_out, &b.causal_lse, &b.causal_dqkv, &b.ranged_out, &b.ranged_dqkv,
                                    &b.block_out,  &b.block_dq,   &b.block_dkv,   &b.cached_out};
  for (int k = 0; k < 9; ++k) {
    const double d = rel_l2(*av[k], *bv[k]);
    std::printf("avx2 vs avx512 %-12s rel L2 %.2e%s\n", names[k], d, *av[k] == *bv[k] ? " (bit-identical)" : "");
    EXPECT_LT(d, 1e-6) << names[k];
  }
}
