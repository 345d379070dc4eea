// The GEMM peak cache (train/gemm_peak_cache.h): entries keyed by CPU, ISA path, thread count and fp32 library,
// replaced in place, an unreadable file reported and left alone; and `atoll train` taking its
// MFU peak from the cache instead of measuring at start-up, and `bench gemm --save --quick` refused.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "kernels/cpu/isa.h"
#include "train/gemm_peak_cache.h"
#include "trainer_fixture.h"

using namespace atl;
using namespace atl::test;

namespace {
std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
}  // namespace

TEST(GemmPeakCache, EntriesAreKeyedByCpuPathAndThreadsAndReplacedInPlace) {
  const fs::path root = scratch("peak_cache");
  const std::string file = (root / "sub" / "peaks.json").string();  // the directory is created
  const GemmPeakKey a{"Some CPU", "avx512", 1}, b{"Some CPU", "avx512", 2}, c{"Some CPU", "amx", 1};
  EXPECT_FALSE(cached_gemm_peak(file, a, "f32").has_value()) << "no file yet";
  save_gemm_peak(file, a, 100.0, 200.0, "onednn-amx");
  save_gemm_peak(file, b, 150.0, 250.0, "onednn-amx");
  EXPECT_EQ(cached_gemm_peak(file, a, "f32"), 100.0);
  EXPECT_EQ(cached_gemm_peak(file, a, "bf16"), 200.0);
  EXPECT_EQ(cached_gemm_peak(file, b, "f32"), 150.0);
  EXPECT_FALSE(cached_gemm_peak(file, c, "f32").has_value()) << "another path is another entry";
  EXPECT_FALSE(cached_gemm_peak(file, {"Other CPU", "avx512", 1}, "f32").has_value());
  // The fp32 library is part of the key: an OpenBLAS-only peak is not the auto setting's.
  EXPECT_FALSE(cached_gemm_peak(file, {"Some CPU", "avx512", 1, "openblas"}, "f32").has_value());
  save_gemm_peak(file, {"Some CPU", "avx512", 1, "openblas"}, 90.0, 200.0, "onednn-amx");
  EXPECT_EQ(cached_gemm_peak(file, {"Some CPU", "avx512", 1, "openblas"}, "f32"), 90.0);
  EXPECT_EQ(cached_gemm_peak(file, a, "f32"), 100.0);
  // So is the bf16 kernel: atoll's own kernel's peak is not oneDNN's.
  EXPECT_FALSE(cached_gemm_peak(file, {"Some CPU", "avx512", 1, "auto", "atoll"}, "bf16").has_value());
  save_gemm_peak(file, a, 110.0, 210.0, "onednn-amx");  // re-measured: replaces, keeps b
  EXPECT_EQ(cached_gemm_peak(file, a, "f32"), 110.0);
  EXPECT_EQ(cached_gemm_peak(file, b, "f32"), 150.0);
  EXPECT_EQ(nlohmann::json::parse(slurp(file)).at("entries").size(), 3u);
  // An entry saved before the library was recorded matches no key (its fp32 peak's library is unknown).
  {
    nlohmann::json j = nlohmann::json::parse(slurp(file));
    for (auto& e : j["entries"]) e.erase("fp32_lib");
    std::ofstream(file) << j.dump();
  }
  EXPECT_FALSE(cached_gemm_peak(file, a, "f32").has_value());
  save_gemm_peak(file, a, 120.0, 220.0, "onednn-amx");
  {
    nlohmann::json j = nlohmann::json::parse(slurp(file));
    for (auto& e : j["entries"]) e.erase("bf16_lib");
    std::ofstream(file) << j.dump();
  }
  EXPECT_FALSE(cached_gemm_peak(file, a, "bf16").has_value()) << "an entry from before the bf16 kernel was recorded";
  EXPECT_THROW(save_gemm_peak(file, a, 0.0, 1.0, "x"), Error);
  fs::remove_all(root);
}

TEST(GemmPeakCache, AnUnreadableFileIsReportedAndLeftAsItWas) {
  const fs::path root = scratch("peak_cache_bad");
  const std::string file = (root / "peaks.json").string();
  std::ofstream(file) << "{ not json";
  std::string note;
  EXPECT_FALSE(cached_gemm_peak(file, {"c", "avx2", 1}, "f32", &note).has_value());
  EXPECT_NE(note.find(file), std::string::npos) << note;
  try {
    save_gemm_peak(file, {"c", "avx2", 1}, 1.0, 1.0, "portable");
    ADD_FAILURE() << "overwrote a file that is not a peak cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(file), "{ not json");
  std::ofstream(file) << R"({"something": "else"})";
  EXPECT_THROW(save_gemm_peak(file, {"c", "avx2", 1}, 1.0, 1.0, "portable"), Error);
  fs::remove_all(root);
}

// The trainer's first lines say where its peak came from: the cache entry of its own key (forced
// path avx2, train.threads = 2, fp32 library auto) when there is one, a start-up measurement otherwise.
TEST(GemmPeakCache, TrainReadsThePeakOfItsPathAndThreadsFromTheCache) {
  const fs::path root = scratch("peak_cache_train");
  const std::string data = make_data(root);
  std::string cfg = tiny_config_text(root, data, 1);
  cfg.replace(cfg.find("peak_gflops = 100.0"), std::string("peak_gflops = 100.0").size(), "");
  std::ofstream(root / "tiny.toml") << cfg;
  const std::string file = (root / "peaks.json").string();
  save_gemm_peak(file, {cpu::cpu_features().model, "avx2", 2}, 12345.0, 23456.0, "portable");
  const std::string cmd = "ATOLL_ISA=avx2 ATOLL_PEAK_CACHE=" + file + " " + atoll_exe() + " train " +
                          (root / "tiny.toml").string() + " --overwrite";
  CmdResult r = run_shell(cmd);
  ASSERT_EQ(r.exit_code(), 0) << r.out;
  EXPECT_TRUE(contains(r.out, "fp32 GEMM peak 12345.0 GFLOP/s (cached for avx2, 2 threads, fp32 gemm auto, bf16 gemm auto in " + file))
      << r.out;
  // Another fp32 library has no entry either: its peak is another library's.
  r = run_shell("ATOLL_GEMM_F32=openblas " + cmd);
  ASSERT_EQ(r.exit_code(), 0) << r.out;
  EXPECT_FALSE(contains(r.out, "12345.0")) << r.out;
  // Another thread count has no entry: measured at start-up, and the message says how to cache it.
  r = run_shell(cmd + " --train.threads=1");
  ASSERT_EQ(r.exit_code(), 0) << r.out;
  EXPECT_FALSE(contains(r.out, "12345.0")) << r.out;
  EXPECT_TRUE(contains(r.out, "measured now; `atoll bench gemm --save` caches it")) << r.out;
  r = run_shell("ATOLL_PEAK_CACHE=" + file + " " + atoll_exe() + " bench gemm --quick --save");
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.out, "--quick")) << r.out;
  fs::remove_all(root);
}
