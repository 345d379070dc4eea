#include "train/gemm_peak_cache.h"

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

namespace atl {

namespace fs = std::filesystem;

GemmPeakKey current_gemm_peak_key(int threads) {
  return {cpu::cpu_features().model, cpu::isa_name(cpu::active_isa()), threads, cpu::gemm_f32_setting(), cpu::gemm_bf16_setting()};
}

std::string gemm_peak_cache_path() {
  if (const char* p = std::getenv("ATOLL_PEAK_CACHE"); p && *p) return p;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "atoll" / "gemm_peaks.json").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : "/tmp") / ".cache" / "atoll" / "gemm_peaks.json").string();
}

namespace {

bool same_key(const nlohmann::json& e, const GemmPeakKey& k) {
  return e.value("cpu", std::string()) == k.cpu && e.value("isa", std::string()) == k.isa &&
         e.value("threads", -1) == k.threads && e.value("fp32_lib", std::string()) == k.fp32_lib &&
         e.value("bf16_lib", std::string()) == k.bf16_lib;
}

// The file's entries; throws with the reason when it exists but is not a peak cache.
nlohmann::json read_entries(const std::string& path) {
  std::ifstream f(path);
  if (!f.good()) return nlohmann::json::array();
  nlohmann::json j;
  try {
    f >> j;
  } catch (const std::exception& e) {
    fail("{}: not a GEMM peak cache (invalid JSON: {})", path, e.what());
  }
  ATOLL_CHECK(j.is_object() && j.contains("entries") && j["entries"].is_array(),
              "{}: not a GEMM peak cache (no \"entries\" list)", path);
  return j["entries"];
}

}  // namespace

void save_gemm_peak(const std::string& path, const GemmPeakKey& key, double fp32_gflops, double bf16_gflops,
                    const std::string& bf16_path) {
  ATOLL_CHECK(fp32_gflops > 0 && bf16_gflops > 0, "GEMM peak cache: peaks must be positive (fp32 {}, bf16 {})",
              fp32_gflops, bf16_gflops);
  nlohmann::json entries = read_entries(path), kept = nlohmann::json::array();
  for (auto& e : entries)
    if (!same_key(e, key)) kept.push_back(e);
  const std::time_t now = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  kept.push_back({{"cpu", key.cpu}, {"isa", key.isa}, {"threads", key.threads}, {"fp32_lib", key.fp32_lib},
                  {"bf16_lib", key.bf16_lib},
                  {"fp32_gflops", fp32_gflops},
                  {"bf16_gflops", bf16_gflops}, {"bf16_path", bf16_path}, {"saved", when}});
  const fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream f(tmp);
    ATOLL_CHECK(f.good(), "cannot write the GEMM peak cache '{}'", tmp);
    f << nlohmann::json{{"entries", kept}}.dump(2) << "\n";
    ATOLL_CHECK(f.good(), "failed writing the GEMM peak cache '{}'", tmp);
  }
  fs::rename(tmp, p, ec);
  ATOLL_CHECK(!ec, "cannot move '{}' to '{}': {}", tmp, path, ec.message());
}

std::optional<double> cached_gemm_peak(const std::string& path, const GemmPeakKey& key, const std::string& dtype,
                                       std::string* note) {
  nlohmann::json entries;
  try {
    entries = read_entries(path);
  } catch (const Error& e) {
    if (note) *note = e.what();
    return std::nullopt;
  }
  const char* field = dtype == "bf16" ? "bf16_gflops" : "fp32_gflops";
  for (auto& e : entries)
    if (same_key(e, key) && e.contains(field) && e[field].is_number() && e[field].get<double>() > 0)
      return e[field].get<double>();
  return std::nullopt;
}

}  // namespace atl
