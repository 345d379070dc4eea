// Every GEMM path this CPU supports against the fp32 reference (OpenBLAS sgemm) on the real
// shapes of the default model's training step (d=384, V=8192, B*T=2048: forward x·W, dX = dY·Wᵀ,
// dW = xᵀ·dY of each linear layer and the tied LM head), the run-time ISA override, and the int8
// kernel. Paths the CPU lacks are skipped, saying which feature is missing.
//
// Tolerances (the same on any x86-64 CPU, since they bound rounding, not a kernel's choices):
//  - bf16 paths on bf16-rounded inputs: every product of two bf16 is exact in fp32, so the paths
//    differ from sgemm only in summation order; fp32 accumulation over K <= 8192 terms of
//    random sign gives a relative L2 error near sqrt(log K)·2^-24 ≈ 1e-7; bound 1e-5.
//  - bf16 paths on raw fp32 inputs (conversion included): each operand carries a relative
//    rounding error up to 2^-9 (8-bit significand), independent per element, so the output's
//    relative L2 error is about 2^-9·sqrt(2/3) ≈ 1.6e-3 with random data; bound 5e-3.
//  - fp32 oneDNN vs OpenBLAS (and each against a double loop): both accumulate in fp32 (oneDNN's
//    default strict fp math mode), in different orders; bound 1e-5 as above.
//  - int8: integer sums are exact; every path must equal the reference bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>

#include "core/error.h"
#include "kernel_test_util.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

using namespace atl;
using namespace atl::test;
using cpu::Isa;

namespace {

struct Case {
  const char* what;
  int64_t M, N, K;
  bool ta, tb;
};

// The default model: d=384, 3d=1152, 4d=1536, V=8192, rows = B*T = 8*256.
const Case kTrainingShapes[] = {
    {"qkv fwd", 2048, 1152, 384, false, false},    {"qkv dX", 2048, 384, 1152, false, true},
    {"qkv dW", 384, 1152, 2048, true, false},      {"mlp down fwd", 2048, 384, 1536, false, false},
    {"mlp down dX", 2048, 1536, 384, false, true}, {"mlp down dW", 1536, 384, 2048, true, false},
    {"head fwd", 2048, 8192, 384, false, true},    {"head dX", 2048, 384, 8192, false, false},
    {"head dW", 8192, 384, 2048, true, false},
};

using Bf16Gemm = std::function<void(bool, bool, int64_t, int64_t, int64_t, float, const bf16*, int64_t,
                                    const bf16*, int64_t, float, float*, int64_t)>;
struct Bf16Path {
  const char* name;
  Isa needs;
  Bf16Gemm f;
};
const Bf16Path kBf16Paths[] = {
    {"portable", Isa::avx2, cpu::gemm_bf16_portable},
    {"avx512_bf16", Isa::avx512_bf16, cpu::gemm_bf16_avx512},
    // oneDNN runs bf16 anywhere, but below AVX-512 only in its slow reference code: not tested there.
    {"onednn", Isa::avx512, cpu::gemm_bf16_onednn},
    {"amx", Isa::amx, cpu::gemm_bf16_amx},
};

std::vector<bf16> round_bf16(std::vector<float>& v) {  // rounds v in place too
  std::vector<bf16> h(v.size());
  cpu::f32_to_bf16(v.data(), h.data(), int64_t(v.size()));
  cpu::bf16_to_f32(h.data(), v.data(), int64_t(v.size()));
  return h;
}

}  // namespace

TEST(GemmPaths, Bf16EveryPathMatchesFp32OnTrainingShapes) {
  std::vector<const Bf16Path*> paths;
  for (const Bf16Path& p : kBf16Paths) {
    std::string why;
    if (cpu::isa_supported(p.needs, &why)) paths.push_back(&p);
    else std::printf("[ SKIPPED  ] bf16 path %s: %s\n", p.name, why.c_str());
  }
  ASSERT_GE(paths.size(), 1u);  // the portable path runs on every x86-64 machine
  for (const Case& c : kTrainingShapes) {
    const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
    auto A = randn(size_t(c.M * c.K), 1), B = randn(size_t(c.K * c.N), 2);
    std::vector<float> ref(size_t(c.M * c.N)), raw(ref.size()), out(ref.size());
    cpu::gemm(c.ta, c.tb, c.M, c.N, c.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, raw.data(), c.N);
    auto Ah = round_bf16(A), Bh = round_bf16(B);
    cpu::gemm(c.ta, c.tb, c.M, c.N, c.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, ref.data(), c.N);
    for (const Bf16Path* p : paths) {
      std::fill(out.begin(), out.end(), NAN);
      p->f(c.ta, c.tb, c.M, c.N, c.K, 1.f, Ah.data(), lda, Bh.data(), ldb, 0.f, out.data(), c.N);
      EXPECT_LT(rel_l2(out, ref), 1e-5) << p->name << " " << c.what;
      const double e = rel_l2(out, raw);
      EXPECT_LT(e, 5e-3) << p->name << " " << c.what << " against unrounded fp32";
      EXPECT_GT(e, 1e-4) << p->name << " " << c.what << ": no bf16 rounding visible, the test is not testing it";
    }
  }
}

TEST(GemmPaths, Bf16PathsHonourAlphaBetaStridesAndOddSizes) {
  // K = 1601 is odd and spans three of the AVX-512 kernel's k blocks; M, N leave partial tiles.
  const int64_t M = 37, N = 70, K = 1601, ldc = N + 5;
  for (const Bf16Path& p : kBf16Paths) {
    std::string why;
    if (!cpu::isa_supported(p.needs, &why)) {
      std::printf("[ SKIPPED  ] bf16 path %s: %s\n", p.name, why.c_str());
      continue;
    }
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2;
      auto A = randn(size_t((ta ? K : M) * lda), 50 + t), B = randn(size_t((tb ? N : K) * ldb), 60 + t);
      auto Ah = round_bf16(A), Bh = round_bf16(B);
      const auto C0 = randn(size_t(M * ldc), 70 + t);
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        auto C = C0, R = C0;
        if (beta == 0.0f) std::fill(C.begin(), C.end(), NAN);  // beta 0 must not read C
        cpu::gemm(ta, tb, M, N, K, 1.25f, A.data(), lda, B.data(), ldb, beta, R.data(), ldc);
        p.f(ta, tb, M, N, K, 1.25f, Ah.data(), lda, Bh.data(), ldb, beta, C.data(), ldc);
        std::vector<float> c, r;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            c.push_back(C[i * ldc + j]);
            r.push_back(R[i * ldc + j]);
          }
        EXPECT_LT(rel_l2(c, r), 1e-5) << p.name << " ta=" << ta << " tb=" << tb << " beta=" << beta;
        for (int64_t i = 0; i < M; ++i)  // columns beyond N untouched
          for (int64_t j = N; j < ldc; ++j)
            ASSERT_TRUE(std::isnan(C[i * ldc + j]) || C[i * ldc + j] == C0[i * ldc + j]) << p.name;
      }
    }
  }
}

// The biased bf16 product the linear layers' forward takes (bias in oneDNN's epilogue on AMX, a
// fill and an accumulating product elsewhere) against sgemm on the same bf16-rounded operands plus
// the bias: only the summation order differs (bound 1e-5, as above), on every path this CPU has.
TEST(GemmPaths, Bf16BiasedProductMatchesFp32OnEveryPath) {
  const cpu::Isa saved = cpu::active_isa();
  const Case shapes[] = {{"qkv fwd", 2048, 1152, 384, false, false}, {"odd", 37, 70, 161, false, false}};
  for (Isa isa : {Isa::avx2, Isa::avx512_bf16, Isa::amx}) {
    std::string why;
    if (!cpu::isa_supported(isa, &why)) {
      std::printf("[ SKIPPED  ] biased bf16 product on %s: %s\n", cpu::isa_name(isa), why.c_str());
      continue;
    }
    cpu::set_isa(isa);
    for (const Case& c : shapes) {
      auto A = randn(size_t(c.M * c.K), 81), B = randn(size_t(c.K * c.N), 82), bias = randn(size_t(c.N), 83);
      auto Ah = round_bf16(A), Bh = round_bf16(B);
      std::vector<float> ref(size_t(c.M * c.N)), out(ref.size(), NAN);
      for (int64_t i = 0; i < c.M; ++i)
        for (int64_t j = 0; j < c.N; ++j) ref[size_t(i * c.N + j)] = bias[size_t(j)];
      cpu::gemm(false, false, c.M, c.N, c.K, 1.f, A.data(), c.K, B.data(), c.N, 1.f, ref.data(), c.N);
      cpu::gemm_bf16_bias(false, false, c.M, c.N, c.K, Ah.data(), c.K, Bh.data(), c.N, bias.data(), out.data(), c.N);
      EXPECT_LT(rel_l2(out, ref), 1e-5) << cpu::isa_name(isa) << " " << c.what;
    }
  }
  cpu::set_isa(saved);
}

TEST(GemmPaths, Fp32OnednnMatchesOpenblasOnTrainingShapes) {
  for (const Case& c : kTrainingShapes) {
    const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
    auto A = randn(size_t(c.M * c.K), 3), B = randn(size_t(c.K * c.N), 4);
    auto C0 = randn(size_t(c.M * c.N), 5);
    auto ref = C0, out = C0;
    cpu::gemm_openblas(c.ta, c.tb, c.M, c.N, c.K, 1.f, A.data(), lda, B.data(), ldb, 1.f, ref.data(), c.N);
    cpu::gemm_onednn(c.ta, c.tb, c.M, c.N, c.K, 1.f, A.data(), lda, B.data(), ldb, 1.f, out.data(), c.N);
    EXPECT_LT(rel_l2(out, ref), 1e-5) << c.what;
  }
}

// Both fp32 libraries against a double-precision loop (the fp32 reference without a library's
// summation order) on the first 48 output rows of every training shape, op(A) and op(B) read
// through the same strides the training uses. Bound 1e-5: fp32 accumulation over K <= 8192
// terms of random sign, in any order, stays near sqrt(K)·2^-24 ≈ 5e-6 relative even in the worst
// blocking; a wrong stride, transpose or alpha/beta handling gives O(1).
TEST(GemmPaths, Fp32LibrariesMatchDoubleReferenceOnTrainingShapes) {
  for (const Case& c : kTrainingShapes) {
    const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N, rows = 48;
    auto A = randn(size_t(c.M * c.K), 13), B = randn(size_t(c.K * c.N), 14);
    auto C0 = randn(size_t(rows * c.N), 15);
    std::vector<double> ref(size_t(rows * c.N));
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < c.K; ++k)
          acc += double(c.ta ? A[k * lda + m] : A[m * lda + k]) * double(c.tb ? B[n * ldb + k] : B[k * ldb + n]);
        ref[m * c.N + n] = 0.5 * acc + 2.0 * double(C0[m * c.N + n]);
      }
    // A row slice of op(A): rows of A, or the first columns of A stored transposed.
    for (auto f : {cpu::gemm_openblas, cpu::gemm_onednn}) {
      auto out = C0;
      f(c.ta, c.tb, rows, c.N, c.K, 0.5f, A.data(), lda, B.data(), ldb, 2.f, out.data(), c.N);
      EXPECT_LT(rel_l2(out, ref), 1e-5) << c.what << (f == cpu::gemm_openblas ? " openblas" : " onednn");
    }
  }
}

// gemm takes the library the setting names (bit-identical to calling it directly), the auto
// rule picks per layout as documented, and an unknown name is refused saying where it came from.
TEST(GemmF32Select, ForcesEachLibraryAndAutoFollowsTheRule) {
  const int64_t M = 192, K = 384;
  auto A = randn(size_t(M * K), 21), B = randn(size_t(K * 480), 22);
  int auto_obl = 0, auto_dnn = 0;
  for (const char* lib : {"openblas", "onednn", "auto"}) {
    cpu::set_gemm_f32(lib);
    for (int64_t n : {160, 480})
    for (bool tb : {false, true}) {
      const int64_t k = K, ldb = tb ? k : n;
      std::vector<float> out(size_t(M * n), NAN), obl(out.size(), NAN), dnn(out.size(), NAN);
      cpu::gemm(false, tb, M, n, k, 1.f, A.data(), k, B.data(), ldb, 0.f, out.data(), n);
      cpu::gemm_openblas(false, tb, M, n, k, 1.f, A.data(), k, B.data(), ldb, 0.f, obl.data(), n);
      cpu::gemm_onednn(false, tb, M, n, k, 1.f, A.data(), k, B.data(), ldb, 0.f, dnn.data(), n);
      const std::string chose = cpu::gemm_f32_choice(false, tb, M, n, k);
      if (std::string(lib) != "auto") EXPECT_EQ(chose, lib);
      else ++(chose == "onednn" ? auto_dnn : auto_obl);
      EXPECT_EQ(out, chose == "onednn" ? dnn : obl) << lib << " n=" << n << " tb=" << tb;
    }
  }
  EXPECT_EQ(auto_obl, 2);  // the NN products stay on OpenBLAS, the NT ones take oneDNN
  EXPECT_EQ(auto_dnn, 2);
  // The rule: oneDNN where only B is transposed (dX, the tied head's forward); OpenBLAS for the
  // other layouts, for one row, and below 2^21 multiply-adds.
  EXPECT_STREQ(cpu::gemm_f32_choice(false, true, 2048, 8192, 384), "onednn");    // tied head fwd
  EXPECT_STREQ(cpu::gemm_f32_choice(false, true, 1024, 768, 3072), "onednn");    // mlp up dX
  EXPECT_STREQ(cpu::gemm_f32_choice(false, true, 1024, 384, 3072), "onednn");    // its tp=2 shard too
  EXPECT_STREQ(cpu::gemm_f32_choice(false, false, 2048, 384, 1536), "openblas"); // mlp down fwd
  EXPECT_STREQ(cpu::gemm_f32_choice(true, false, 384, 384, 2048), "openblas");   // attn proj dW
  EXPECT_STREQ(cpu::gemm_f32_choice(true, true, 384, 384, 2048), "openblas");    // both transposed
  EXPECT_STREQ(cpu::gemm_f32_choice(false, true, 1, 8192, 384), "openblas");     // decoding row
  EXPECT_STREQ(cpu::gemm_f32_choice(false, true, 64, 64, 64), "openblas");       // tiny
  EXPECT_THROW(cpu::select_gemm_f32("mkl", "hardware.gemm_f32 (t.toml:4)"), Error);
  try {
    cpu::select_gemm_f32("mkl", "hardware.gemm_f32 (t.toml:4)");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.toml:4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("openblas"), std::string::npos) << "lists the choices: " << e.what();
  }
  ::setenv("ATOLL_GEMM_F32", "blis", 1);
  EXPECT_THROW(cpu::select_gemm_f32("auto", "hardware.gemm_f32"), Error);  // the env var is checked too
  ::setenv("ATOLL_GEMM_F32", "openblas", 1);
  EXPECT_NE(cpu::select_gemm_f32("onednn", "hardware.gemm_f32").find("openblas"), std::string::npos);
  EXPECT_STREQ(cpu::gemm_f32_choice(false, true, 2048, 8192, 384), "openblas");  // the env var wins
  ::unsetenv("ATOLL_GEMM_F32");
  cpu::set_gemm_f32("auto");
}

// Under each ISA with bf16 instructions, every bf16 entry point (plain, batched, biased) takes the
// kernel the setting names, bit for bit the direct call; below AVX-512 BF16 a forced kernel is
// refused naming where the setting came from, an unknown name is refused listing the choices, and
// ATOLL_GEMM_BF16 wins over the config.
TEST(GemmBf16Select, ForcesEachKernelOnEveryEntryPointAndRefusesWhereItCannotRun) {
  const Isa saved = cpu::active_isa();
  // K past atoll's 768-deep k block: below it atoll's kernel and oneDNN's avx512_core_bf16 one add
  // in the same order and agree bit for bit, so only a deeper product tells which one ran.
  const int64_t M = 96, N = 160, K = 1536, batch = 3;
  auto Af = randn(size_t(batch * M * K), 31), Bf = randn(size_t(batch * K * N), 32);
  auto A = round_bf16(Af), B = round_bf16(Bf);
  std::vector<float> bias = randn(size_t(N), 33);
  int checked = 0;
  for (Isa i : {Isa::avx512_bf16, Isa::amx}) {
    if (!cpu::isa_supported(i)) continue;
    cpu::set_isa(i);
    {
      std::vector<float> x(size_t(M * N)), y(x.size());
      cpu::gemm_bf16_avx512(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, x.data(), N);
      cpu::gemm_bf16_onednn(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, y.data(), N);
      if (x == y) std::printf("note: under %s the two kernels agree bit for bit here; only the path names tell them apart\n",
                              cpu::isa_name(i));
    }
    for (const char* lib : {"atoll", "onednn"}) {
      const std::string want = std::string(lib) == "atoll" ? "avx512_bf16" : i == Isa::amx ? "onednn-amx" : "onednn-avx512_bf16";
      EXPECT_EQ(cpu::select_gemm_bf16(lib, "hardware.gemm_bf16"), "bf16 gemm: " + want) << lib;
      EXPECT_STREQ(cpu::gemm_bf16_setting(), lib);
      EXPECT_EQ(cpu::gemm_bf16_path(), want);
      const Bf16Gemm f = std::string(lib) == "atoll" ? Bf16Gemm(cpu::gemm_bf16_avx512) : Bf16Gemm(cpu::gemm_bf16_onednn);
      std::vector<float> out(size_t(batch * M * N), NAN), direct(out.size(), NAN);
      cpu::gemm_bf16(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, out.data(), N);
      f(false, true, M, N, K, 1.f, A.data(), K, B.data(), K, 0.f, direct.data(), N);
      EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + M * N), std::vector<float>(direct.begin(), direct.begin() + M * N))
          << lib << " " << cpu::isa_name(i);
      cpu::gemm_bf16_batched(false, false, M, N, K, 0.5f, A.data(), K, M * K, B.data(), N, K * N, 0.f, out.data(), N,
                             M * N, batch);
      for (int64_t b = 0; b < batch; ++b)
        f(false, false, M, N, K, 0.5f, A.data() + b * M * K, K, B.data() + b * K * N, N, 0.f, direct.data() + b * M * N, N);
      if (std::string(lib) == "atoll") EXPECT_EQ(out, direct) << "batched, " << cpu::isa_name(i);
      else EXPECT_LT(rel_l2(out, direct), 1e-6) << "batched, " << cpu::isa_name(i);  // one batched primitive may block differently
      std::vector<float> biased(size_t(M * N), NAN), plus(size_t(M * N));
      cpu::gemm_bf16_bias(false, false, M, N, K, A.data(), K, B.data(), N, bias.data(), biased.data(), N);
      for (int64_t r = 0; r < M; ++r)
        for (int64_t c = 0; c < N; ++c) plus[size_t(r * N + c)] = bias[size_t(c)];
      f(false, false, M, N, K, 1.f, A.data(), K, B.data(), N, 1.f, plus.data(), N);
      EXPECT_LT(rel_l2(biased, plus), 1e-6) << "biased, " << lib;  // oneDNN adds the bias in its epilogue, last
      ++checked;
    }
  }
  if (cpu::isa_supported(Isa::avx512)) {
    cpu::set_isa(Isa::avx512);
    try {
      cpu::select_gemm_bf16("atoll", "hardware.gemm_bf16 (t.toml:5)");
      ADD_FAILURE() << "a bf16 kernel was accepted on a path without AVX-512 BF16";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("t.toml:5"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("needs AVX-512 BF16"), std::string::npos) << e.what();
    }
    EXPECT_NE(cpu::select_gemm_bf16("auto", "hardware.gemm_bf16").find("portable"), std::string::npos);
  }
  try {
    cpu::select_gemm_bf16("mkl", "hardware.gemm_bf16 (t.toml:6)");
    ADD_FAILURE() << "an unknown kernel name was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("t.toml:6"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("atoll or onednn"), std::string::npos) << "lists the choices: " << e.what();
  }
  cpu::set_isa(saved);
  if (cpu::active_isa() >= Isa::avx512_bf16) {
    ::setenv("ATOLL_GEMM_BF16", "atoll", 1);
    EXPECT_NE(cpu::select_gemm_bf16("onednn", "hardware.gemm_bf16").find("avx512_bf16 (ATOLL_GEMM_BF16)"),
              std::string::npos);
    EXPECT_STREQ(cpu::gemm_bf16_setting(), "atoll");  // the env var wins
    ::setenv("ATOLL_GEMM_BF16", "blas", 1);
    EXPECT_THROW(cpu::select_gemm_bf16("auto", "hardware.gemm_bf16"), Error);
    ::unsetenv("ATOLL_GEMM_BF16");
  }
  cpu::set_gemm_bf16("auto");
  if (checked == 0) std::printf("[ SKIPPED  ] the kernel choice: this CPU has no AVX-512 BF16 (only the refusals ran)\n");
}

// The override: each supported path is taken when forced, and dispatching through gemm_bf16
// then gives that path's result; an unknown or unsupported path is refused with the reason.
TEST(IsaOverride, ForcesEverySupportedPath) {
  const Isa saved = cpu::active_isa();
  const int64_t M = 64, N = 96, K = 384;
  auto A = randn(size_t(M * K), 7), B = randn(size_t(K * N), 8);
  auto Ah = round_bf16(A), Bh = round_bf16(B);
  std::vector<float> ref(size_t(M * N));
  cpu::gemm(false, false, M, N, K, 1.f, A.data(), K, B.data(), N, 0.f, ref.data(), N);
  int forced = 0;
  for (Isa i : {Isa::avx2, Isa::avx512, Isa::avx512_bf16, Isa::amx}) {
    std::string why;
    if (!cpu::isa_supported(i, &why)) {
      std::printf("[ SKIPPED  ] %s: %s\n", cpu::isa_name(i), why.c_str());
      continue;
    }
    cpu::set_isa(i);
    ++forced;
    EXPECT_EQ(cpu::active_isa(), i);
    const std::string path = cpu::gemm_bf16_path();
    EXPECT_EQ(path, i == Isa::amx ? "onednn-amx" : i == Isa::avx512_bf16 ? "onednn-avx512_bf16" : "portable");
    std::vector<float> out(ref.size(), NAN), direct(ref.size(), NAN);
    cpu::gemm_bf16(false, false, M, N, K, 1.f, Ah.data(), K, Bh.data(), N, 0.f, out.data(), N);
    EXPECT_LT(rel_l2(out, ref), 1e-5) << cpu::isa_name(i);
    // Dispatch really took that path: bit-identical to calling it directly.
    const Bf16Gemm f = i >= Isa::avx512_bf16 ? Bf16Gemm(cpu::gemm_bf16_onednn) : Bf16Gemm(cpu::gemm_bf16_portable);
    f(false, false, M, N, K, 1.f, Ah.data(), K, Bh.data(), N, 0.f, direct.data(), N);
    EXPECT_EQ(out, direct) << cpu::isa_name(i);
    EXPECT_NE(cpu::isa_summary().find(std::string("kernels: ") + cpu::isa_name(i)), std::string::npos)
        << cpu::isa_summary();
  }
  EXPECT_GE(forced, 1);
  cpu::set_isa(saved);
}

TEST(IsaOverride, RefusesAnUnknownNameSayingWhere) {
  const Isa before = cpu::active_isa();
  EXPECT_THROW(cpu::select_isa("avx1024", "hardware.isa (test.toml:3)"), Error);
  try {
    cpu::select_isa("avx1024", "hardware.isa (test.toml:3)");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("test.toml:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("avx512_bf16"), std::string::npos) << "lists the choices: " << e.what();
  }
  EXPECT_EQ(cpu::active_isa(), before);
}

TEST(IsaOverride, RefusesAPathTheCpuLacks) {
  bool any = false;
  for (Isa i : {Isa::avx2, Isa::avx512, Isa::avx512_bf16, Isa::amx}) {
    std::string why;
    if (cpu::isa_supported(i, &why)) continue;
    any = true;
    const Isa before = cpu::active_isa();
    try {
      cpu::set_isa(i);
      ADD_FAILURE() << "forcing " << cpu::isa_name(i) << " was accepted on a CPU without it";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    EXPECT_EQ(cpu::active_isa(), before);  // a refused override changes nothing
  }
  if (!any) GTEST_SKIP() << "this CPU (" << cpu::cpu_features().model << ") supports every path: none to refuse";
}

TEST(IsaDetection, AgreesWithProcCpuinfo) {
  std::FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (!f) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  auto has = [&](const char* flag) { return s.find(std::string(" ") + flag + " ") != std::string::npos ||
                                            s.find(std::string(" ") + flag + "\n") != std::string::npos; };
  const auto& c = cpu::cpu_features();
  EXPECT_EQ(c.avx2, has("avx2"));
  EXPECT_EQ(c.avx512_bf16, has("avx512_bf16"));
  EXPECT_EQ(c.amx_tile, has("amx_tile"));
  EXPECT_EQ(c.amx_bf16, has("amx_bf16"));
  EXPECT_EQ(c.amx_int8, has("amx_int8"));
  EXPECT_EQ(cpu::has_avx512_bf16(), has("avx512_bf16"));
  EXPECT_EQ(cpu::isa_supported(Isa::amx), c.amx_bf16 && c.amx_os && c.avx512_bf16);
}

TEST(GemmInt8, EveryPathIsExact) {
  const auto& f = cpu::cpu_features();
  const bool onednn = f.avx512_vnni || (f.amx_int8 && f.amx_os);
  if (!onednn) std::printf("[ SKIPPED  ] int8 oneDNN path: no AVX-512 VNNI or usable AMX-INT8 on this CPU\n");
  const Case shapes[] = {{"odd", 37, 70, 129, false, false}, {"odd tA", 37, 70, 129, true, false},
                         {"odd tB", 37, 70, 129, false, true},
                         // Row slices of the default model's qkv forward and dW (the naive reference is slow).
                         {"qkv fwd rows", 256, 1152, 384, false, false}, {"qkv dW rows", 384, 1152, 256, true, false}};
  for (const Case& c : shapes) {
    const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
    auto ai = randint(size_t(c.M * c.K), -128, 128, 11), bi = randint(size_t(c.K * c.N), -128, 128, 12);
    std::vector<int8_t> A(ai.begin(), ai.end()), B(bi.begin(), bi.end());
    std::vector<int32_t> ref(size_t(c.M * c.N)), one(ref.size(), -1), dispatched(ref.size(), -1);
    // Reference by direct loops in int64 (no shared code with the kernels).
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        int64_t s = 0;
        for (int64_t k = 0; k < c.K; ++k)
          s += int64_t(c.ta ? A[k * lda + i] : A[i * lda + k]) * int64_t(c.tb ? B[j * ldb + k] : B[k * ldb + j]);
        ref[i * c.N + j] = int32_t(s);
      }
    if (onednn) {
      cpu::gemm_s8_onednn(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, one.data(), c.N);
      EXPECT_EQ(one, ref) << "oneDNN " << c.what;
    }
    cpu::gemm_s8(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, dispatched.data(), c.N);
    EXPECT_EQ(dispatched, ref) << cpu::gemm_s8_path() << " " << c.what;
    std::vector<int32_t> loops(ref.size(), -1);
    cpu::gemm_s8_reference(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, loops.data(), c.N);
    EXPECT_EQ(loops, ref) << "loops " << c.what;
  }
  std::printf("int8 path in use: %s (%s)\n", cpu::gemm_s8_path(), cpu::onednn_version().c_str());
}
