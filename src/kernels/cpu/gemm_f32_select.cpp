// Which library runs an fp32 product: OpenBLAS (gemm.cpp) or oneDNN's matmul (gemm_onednn.cpp).
// `auto` applies a rule by operand layout that bench/bench_gemm_f32 measured on the training's
// shapes (docs/gemm_f32.md has the figures); the config key hardware.gemm_f32 or the environment
// variable ATOLL_GEMM_F32 (which takes precedence, like ATOLL_ISA over hardware.isa) force one
// library for every product.
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/gemm.h"

namespace atl::cpu {

namespace {

enum class Lib { automatic, openblas, onednn };
const char* const kNames[] = {"auto", "openblas", "onednn"};
std::atomic<int> g_lib{-1};
std::mutex g_mu;

Lib parse(const std::string& name, const std::string& where) {
  for (int i = 0; i < 3; ++i)
    if (name == kNames[i]) return Lib(i);
  fail("{}: unknown fp32 GEMM library '{}' (expected auto, openblas or onednn)", where, name);
}

Lib active() {
  const int a = g_lib.load(std::memory_order_relaxed);
  if (a >= 0) return Lib(a);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_lib.load() < 0) {
    const char* env = std::getenv("ATOLL_GEMM_F32");
    g_lib.store(int(env && *env ? parse(env, "ATOLL_GEMM_F32") : Lib::automatic));
  }
  return Lib(g_lib.load());
}

// The measured rule (docs/gemm_f32.md; bench/bench_gemm_f32, 2 threads, Xeon with AMX): oneDNN
// where op(B) is read transposed and op(A) is not (the dX product dY·Wᵀ of every linear layer,
// the tied LM head's forward: 0.96-2.2x OpenBLAS on every such training shape), OpenBLAS for the
// other layouts, where oneDNN 2.6 ranged from 1.75x down to 0.33x with no simple boundary (it
// lost on wide outputs over a short reduction and on GPT-2's 50257-wide head). The layout alone
// decides, so a tensor-parallel shard takes the library of the unsharded product. Below 2^21
// multiply-adds (128³) and for one row OpenBLAS stays: oneDNN's per-call set-up and per-shape
// primitive would cost more than they save there.
bool rule_onednn(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  if (M <= 1 || double(M) * double(N) * double(K) < double(1 << 21)) return false;
  return tb && !ta;
}

}  // namespace

const std::vector<std::string>& gemm_f32_choices() {
  static const std::vector<std::string> v = {"auto", "openblas", "onednn"};
  return v;
}

std::string select_gemm_f32(const std::string& name, const std::string& where) {
  const Lib wanted = parse(name.empty() ? "auto" : name, where);  // a bad name is an error even under the env
  const char* env = std::getenv("ATOLL_GEMM_F32");
  const Lib lib = env && *env ? parse(env, "ATOLL_GEMM_F32") : wanted;
  g_lib.store(int(lib));
  return fmt::format("fp32 gemm: {}{}", gemm_path(), env && *env ? " (ATOLL_GEMM_F32)" : "");
}

const char* gemm_f32_setting() { return kNames[int(active())]; }

void set_gemm_f32(const std::string& name) { g_lib.store(int(parse(name, "set_gemm_f32"))); }

const char* gemm_f32_choice(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  switch (active()) {
    case Lib::openblas: return "openblas";
    case Lib::onednn: return M > 1 ? "onednn" : "openblas";
    case Lib::automatic: break;
  }
  return rule_onednn(ta, tb, M, N, K) ? "onednn" : "openblas";
}

const char* gemm_path() {
  switch (active()) {
    case Lib::openblas: return "openblas";
    case Lib::onednn: return "onednn";
    case Lib::automatic: break;
  }
  return "auto (onednn where only B is transposed, else openblas)";
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const Lib lib = active();
  const bool dnn = lib == Lib::onednn ? M > 1 : lib == Lib::automatic && rule_onednn(ta, tb, M, N, K);
  if (dnn) gemm_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else gemm_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace atl::cpu
