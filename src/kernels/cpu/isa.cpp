// Run-time ISA detection and the process-wide choice of kernel path (see isa.h). Feature bits are
// from Intel's SDM vol. 2 (CPUID leaf 7) and vol. 1 ch. 13 (XCR0 state components); the AMX
// permission request is Linux's arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) (5.16+):
// without it the first tile load kills the process with SIGILL.
#include "kernels/cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace atl::cpu {

namespace {

#if defined(__x86_64__)
uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  char brand[49] = {};
  if (__get_cpuid_max(0x80000000u, nullptr) >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i) {
      __cpuid(0x80000002u + i, a, b, c, d);
      std::memcpy(brand + 16 * i, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
  }
  f.model = brand;
  while (!f.model.empty() && f.model.front() == ' ') f.model.erase(f.model.begin());
  while (!f.model.empty() && f.model.back() == ' ') f.model.pop_back();
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28);
  f.fma = c & (1u << 12);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;              // SSE and AVX state
  const bool os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0;  // opmask, ZMM_Hi256, Hi16_ZMM
  const bool os_tile = (xcr0 & 0x60000) == 0x60000;     // XTILECFG, XTILEDATA
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned b7 = b, c7 = c, d7 = d;
  __cpuid_count(7, 1, a, b, c, d);
  const unsigned a71 = a;
  f.avx2 = os_ymm && (b7 & (1u << 5)) && f.fma;
  f.avx512 = f.avx2 && os_zmm && (b7 & (1u << 16)) && (b7 & (1u << 17)) && (b7 & (1u << 30)) && (b7 & (1u << 31));
  f.avx512_vnni = f.avx512 && (c7 & (1u << 11));
  f.avx512_bf16 = f.avx512 && (a71 & (1u << 5));
  f.amx_bf16 = d7 & (1u << 22);
  f.amx_tile = d7 & (1u << 24);
  f.amx_int8 = d7 & (1u << 25);
  if (f.amx_tile) {
    if (!os_tile) {
      f.amx_note = "the OS does not enable AMX tile state (XCR0 bits 17-18)";
    } else {
      constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
      if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) f.amx_os = true;
      else f.amx_note = "the kernel refused arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) (Linux < 5.16?)";
    }
  }
  return f;
}
#else
CpuFeatures detect() { return {}; }
#endif

const char* kNames[] = {"avx2", "avx512", "avx512_bf16", "amx"};

Isa parse(const std::string& name, const std::string& where) {
  for (int i = 0; i < 4; ++i)
    if (name == kNames[i]) return Isa(i);
  fail("{}: unknown ISA '{}' (choose auto, avx2, avx512, avx512_bf16 or amx)", where, name);
}

}  // namespace
void onednn_cap_isa(Isa isa);  // gemm_onednn.cpp
namespace {

std::mutex g_mu;
std::atomic<int> g_active{-1};
std::string g_source = "detected";

void force(Isa isa, const std::string& where, bool cap_onednn = true) {
  std::string why;
  ATOLL_CHECK(isa_supported(isa, &why), "{}: the {} path cannot run on this CPU ({}): {}", where, isa_name(isa),
              cpu_features().model, why);
  g_active.store(int(isa));
  g_source = where;
  if (cap_onednn) onednn_cap_isa(isa);
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool isa_supported(Isa isa, std::string* why_not) {
  const CpuFeatures& f = cpu_features();
  std::string why;
  switch (isa) {
    case Isa::amx:
      if (!f.amx_tile || !f.amx_bf16) why = "no AMX-BF16 (cpuid leaf 7 EDX bits 22/24)";
      else if (!f.amx_os) why = f.amx_note;
      else if (!f.avx512_bf16) why = "no AVX-512 BF16, which the AMX path's conversions use";
      break;
    case Isa::avx512_bf16:
      if (!f.avx512_bf16) why = f.avx512 ? "no AVX512_BF16 (cpuid leaf 7.1 EAX bit 5)" : "no usable AVX-512";
      break;
    case Isa::avx512:
      if (!f.avx512) why = "no AVX-512 F/DQ/BW/VL, or the OS does not save zmm state";
      break;
    case Isa::avx2:
      if (!f.avx2) why = "no AVX2/FMA (atoll's portable build targets x86-64-v3)";
      break;
  }
  if (why_not) *why_not = why;
  return why.empty();
}

Isa best_isa() {
  for (Isa i : {Isa::amx, Isa::avx512_bf16, Isa::avx512})
    if (isa_supported(i)) return i;
  return Isa::avx2;
}

const char* isa_name(Isa isa) { return kNames[int(isa)]; }

const std::vector<std::string>& isa_choices() {
  static const std::vector<std::string> v = {"auto", "avx2", "avx512", "avx512_bf16", "amx"};
  return v;
}

Isa active_isa() {
  int a = g_active.load(std::memory_order_relaxed);
  if (a >= 0) return Isa(a);
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_active.load() < 0) {
    const char* env = std::getenv("ATOLL_ISA");
    if (env && *env && std::string(env) != "auto") force(parse(env, "ATOLL_ISA"), "ATOLL_ISA");
    else g_active.store(int(best_isa()));
  }
  return Isa(g_active.load());
}

void set_isa(Isa isa) {
  std::lock_guard<std::mutex> lock(g_mu);
  force(isa, "set_isa", /*cap_onednn=*/false);  // tests switch paths; oneDNN keeps its own choice
}

std::string select_isa(const std::string& name, const std::string& where) {
  const bool forced = !name.empty() && name != "auto";
  const Isa wanted = forced ? parse(name, where) : Isa::avx2;  // a bad name is an error even under ATOLL_ISA
  const char* env = std::getenv("ATOLL_ISA");
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (env && *env && std::string(env) != "auto") {
      force(parse(env, "ATOLL_ISA"), "ATOLL_ISA");
    } else if (forced && !(env && *env)) {
      force(wanted, where);
    } else {
      g_active.store(int(best_isa()));
      g_source = "detected";
    }
  }
  return isa_summary();
}

std::string isa_summary() {
  const Isa a = active_isa();
  const CpuFeatures& f = cpu_features();
  std::string have;
  for (Isa i : {Isa::avx2, Isa::avx512, Isa::avx512_bf16, Isa::amx})
    if (isa_supported(i)) have += std::string(have.empty() ? "" : " ") + isa_name(i);
  if (f.avx512_vnni) have += " avx512_vnni";
  if (f.amx_int8 && f.amx_os) have += " amx_int8";
  std::string source;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    source = g_source;
  }
  std::string s = fmt::format("cpu: {}; kernels: {} ({}), supported: {}", f.model.empty() ? "unknown" : f.model,
                              isa_name(a), source, have.empty() ? "none" : have);
  if (!f.amx_note.empty()) s += "; AMX unusable: " + f.amx_note;
  return s;
}

}  // namespace atl::cpu
