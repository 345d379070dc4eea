// The GEMM peak MFU is taken against, measured once per machine, kernel path and thread count by
// `atoll bench gemm --save` and read at start-up, instead of every rank timing a GEMM while the
// other ranks of the job compete for the same cores (issue 18: the default 2-rank job measured 76
// GFLOP/s per rank where one rank alone measures 109, inflating its MFU by 40%).
//
// The cache is one JSON file: ATOLL_PEAK_CACHE if set, else $XDG_CACHE_HOME/atoll/gemm_peaks.json,
// else ~/.cache/atoll/gemm_peaks.json. An entry is keyed by the CPU model (cpuid's brand string),
// the active ISA path, the thread count and the fp32 library setting (hardware.gemm_f32 /
// ATOLL_GEMM_F32: the fp32 peak is that library's) and the bf16 kernel setting (hardware.gemm_bf16
// / ATOLL_GEMM_BF16), and holds the fp32 and bf16 peaks of the GEMM paths in use. Entries saved
// before a setting was recorded match no key (re-measured).
#pragma once
#include <optional>
#include <string>

namespace atl {

struct GemmPeakKey {
  std::string cpu, isa;
  int threads = 0;
  std::string fp32_lib = "auto";
  std::string bf16_lib = "auto";  // hardware.gemm_bf16 / ATOLL_GEMM_BF16: the bf16 peak is that kernel's
};

// This process's key: the detected CPU, the active path, `threads` threads, the GEMM settings.
GemmPeakKey current_gemm_peak_key(int threads);
std::string gemm_peak_cache_path();

// Adds or replaces the key's entry, keeping every other entry; written to a temporary file and
// renamed, so a reader never sees half a file. A file that exists but is not a peak cache is an
// error naming it (and is left as it was).
void save_gemm_peak(const std::string& path, const GemmPeakKey& key, double fp32_gflops, double bf16_gflops,
                    const std::string& bf16_path);

// The key's peak for `dtype` ("f32" or "bf16"), or nothing: no file, no entry for this key, or an
// unreadable file (then *note says why; the caller measures instead).
std::optional<double> cached_gemm_peak(const std::string& path, const GemmPeakKey& key, const std::string& dtype,
                                       std::string* note = nullptr);

}  // namespace atl
