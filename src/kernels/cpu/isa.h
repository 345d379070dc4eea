// The instruction sets the CPU kernels may use, detected at run time (cpuid for what the CPU has,
// XGETBV for what the OS saves on a context switch, and Linux's arch_prctl permission request for
// AMX's tile data), never taken from the machine that built the binary. One path is active per
// process: the best one detected, or one forced by the config key hardware.isa or the
// environment variable ATOLL_ISA (for tests and comparisons); forcing a path the CPU lacks is an
// error that says what is missing.
#pragma once
#include <string>
#include <vector>

namespace atl::cpu {

// Ordered: each path needs everything the one before it needs.
//   avx2        fp32 OpenBLAS; bf16 widened to fp32 (the portable path)
//   avx512      the same kernels (OpenBLAS picks its AVX-512 ones itself)
//   avx512_bf16 bf16 GEMM on VDPBF16PS (gemm_bf16.cpp)
//   amx         bf16 GEMM on AMX-BF16 tiles (oneDNN's matmul, gemm_onednn.cpp)
enum class Isa { avx2, avx512, avx512_bf16, amx };

struct CpuFeatures {
  std::string model;  // cpuid's brand string
  bool avx2 = false, fma = false;
  bool avx512 = false;       // F, DQ, BW, VL and the OS saves zmm state
  bool avx512_bf16 = false;  // and the above
  bool avx512_vnni = false;  // and avx512
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;  // the CPU has them
  bool amx_os = false;       // XCR0 enables tile state and the kernel granted this process XTILEDATA
  std::string amx_note;      // why AMX is unusable when the CPU has it (empty otherwise)
};

const CpuFeatures& cpu_features();  // detected once (thread-safe); requests AMX permission
bool isa_supported(Isa isa, std::string* why_not = nullptr);
Isa best_isa();
const char* isa_name(Isa isa);
const std::vector<std::string>& isa_choices();  // "auto" and every isa_name

// The active path: on first use ATOLL_ISA if set, else best_isa().
Isa active_isa();
// Forces a path (throws, saying what the CPU lacks, when it is unsupported).
void set_isa(Isa isa);
// Applies a setting from `where` ("auto" or an isa name; ATOLL_ISA, when set, takes precedence)
// and returns the one-line summary a run prints first.
std::string select_isa(const std::string& name, const std::string& where);
// "cpu: <model>; kernels: amx (bf16 AMX tiles via oneDNN), detected avx2 avx512 ..."
std::string isa_summary();

}  // namespace atl::cpu
