// Which kernel runs a bf16 product: oneDNN's matmul (gemm_onednn.cpp: AMX tiles where the CPU has
// them, its AVX-512 BF16 kernels where it has those), atoll's own AVX-512 BF16 kernel
// (gemm_bf16.cpp), or the widened fp32 product on CPUs with neither. `auto` takes oneDNN wherever
// the CPU has bf16 instructions: it was the faster on every training shape measured (the rule's
// comment has the figures); hardware.gemm_bf16 or ATOLL_GEMM_BF16 (the environment wins, as
// ATOLL_ISA over hardware.isa) force one, and the other stays as the fallback and the comparison.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"

namespace atl::cpu {

namespace {

enum class Lib { automatic, atoll, onednn };
const char* const kNames[] = {"auto", "atoll", "onednn"};
std::atomic<int> g_lib{-1};
std::mutex g_mu;

Lib parse(const std::string& name, const std::string& where) {
  for (int i = 0; i < 3; ++i)
    if (name == kNames[i]) return Lib(i);
  fail("{}: unknown bf16 GEMM kernel '{}' (expected auto, atoll or onednn)", where, name);
}

Lib setting() {
  const int a = g_lib.load(std::memory_order_relaxed);
  if (a >= 0) return Lib(a);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_lib.load() < 0) {
    const char* env = std::getenv("ATOLL_GEMM_BF16");
    g_lib.store(int(env && *env ? parse(env, "ATOLL_GEMM_BF16") : Lib::automatic));
  }
  return Lib(g_lib.load());
}

// What a product runs on under the setting and the active ISA. Below AVX-512 BF16 neither kernel
// has its instructions (oneDNN would emulate them), so every setting widens to fp32 there; a
// setting forced where it cannot apply is refused by select_gemm_bf16 before it gets here.
//
// The measured rule for `auto` (bench/gemm_vs_torch.sh 2 5 3 d384, 2 threads, medians of 3
// rounds): on an AMD EPYC (Zen 4, AVX-512 BF16, no AMX) oneDNN 2.6's avx512_core_bf16 matmul ran
// 1.0-1.5x atoll's kernel on all 16 d384 training shapes (334-401 against 270-346 GFLOP/s; equal
// on the LM head's dW); on an Intel Xeon with AMX its AMX matmul ran 2.5x atoll's AMX tile kernel
// and 9x its AVX-512 BF16 one on the LM head's dX (README, session 5).
enum class Path { onednn, atoll, widened };
Path path() {
  const Isa isa = active_isa();
  if (isa < Isa::avx512_bf16) return Path::widened;
  return setting() == Lib::atoll ? Path::atoll : Path::onednn;
}

}  // namespace

const std::vector<std::string>& gemm_bf16_choices() {
  static const std::vector<std::string> v = {"auto", "atoll", "onednn"};
  return v;
}

std::string select_gemm_bf16(const std::string& name, const std::string& where) {
  const Lib wanted = parse(name.empty() ? "auto" : name, where);  // a bad name is an error even under the env
  const char* env = std::getenv("ATOLL_GEMM_BF16");
  const bool from_env = env && *env;
  const Lib lib = from_env ? parse(env, "ATOLL_GEMM_BF16") : wanted;
  ATOLL_CHECK(lib == Lib::automatic || active_isa() >= Isa::avx512_bf16,
              "{}: the bf16 GEMM kernel '{}' needs AVX-512 BF16, which the active path {} lacks (bf16 products are "
              "widened to fp32 there); use \"auto\"",
              from_env ? std::string("ATOLL_GEMM_BF16") : where, kNames[int(lib)], isa_name(active_isa()));
  g_lib.store(int(lib));
  return fmt::format("bf16 gemm: {}{}", gemm_bf16_path(), from_env ? " (ATOLL_GEMM_BF16)" : "");
}

void set_gemm_bf16(const std::string& name) { g_lib.store(int(parse(name, "set_gemm_bf16"))); }

const char* gemm_bf16_setting() { return kNames[int(setting())]; }

const char* gemm_bf16_path() {
  switch (path()) {
    case Path::onednn: return active_isa() == Isa::amx ? "onednn-amx" : "onednn-avx512_bf16";
    case Path::atoll: return "avx512_bf16";
    case Path::widened: break;
  }
  return "portable";
}

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) return gemm_bf16_portable(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  switch (path()) {
    case Path::onednn: return gemm_bf16_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    case Path::atoll: return gemm_bf16_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    case Path::widened: break;
  }
  gemm_bf16_portable(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                       int64_t sa, const bf16* B, int64_t ldb, int64_t sb, float beta, float* C, int64_t ldc,
                       int64_t sc, int64_t batch) {
  if (M == 0 || N == 0 || batch == 0) return;
  const Path p = path();
  if (p == Path::onednn)
    return gemm_bf16_batched_onednn(ta, tb, M, N, K, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch);
  // One matrix per thread: each call below then runs on its own thread (nested OpenMP regions
  // are serial), which suits the small per-head products attention makes.
#pragma omp parallel for schedule(dynamic, 1) if(parallel : batch > 1 && batch * M * N * K >= detail::kMinParallelWork)
  for (int64_t i = 0; i < batch; ++i) {
    if (p == Path::atoll) gemm_bf16_avx512(ta, tb, M, N, K, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, ldc);
    else gemm_bf16_portable(ta, tb, M, N, K, alpha, A + i * sa, lda, B + i * sb, ldb, beta, C + i * sc, ldc);
  }
}

void gemm_bf16_bias(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda, const bf16* B,
                    int64_t ldb, const float* bias, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (path() == Path::onednn) return gemm_bf16_bias_onednn(ta, tb, M, N, K, A, lda, B, ldb, bias, C, ldc);
#pragma omp parallel for schedule(static) if(parallel : M * N >= detail::kMinParallelWork)
  for (int64_t i = 0; i < M; ++i) std::memcpy(C + i * ldc, bias, size_t(N) * sizeof(float));
  gemm_bf16(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 1.0f, C, ldc);
}

}  // namespace atl::cpu
