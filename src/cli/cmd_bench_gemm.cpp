// `atoll bench gemm`: the GEMM throughput this machine actually reaches, fp32 (OpenBLAS sgemm)
// and bf16 (atoll's AVX-512 BF16 kernel), over square and GPT-2-shaped products. The trainer
// divides its model FLOP/s by the measured peak to report MFU against this machine, not a
// datasheet.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"

namespace atl::cli {

namespace {

struct Shape3 {
  int64_t M, N, K;
  const char* what;
};

// Median seconds of `reps` calls after one warm-up, stopping early once `budget_s` is spent.
template <typename F>
double median_seconds(F&& f, int reps, double budget_s) {
  f();
  std::vector<double> t;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    f();
    const auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
    if (std::chrono::duration<double>(b - start).count() > budget_s && t.size() >= 3) break;
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int run_bench_gemm(int argc, char** argv) {
  CLI::App app{"Measure fp32 and bf16 GEMM throughput (GFLOP/s); the peak is what MFU is computed against"};
  int threads = 0, reps = 5;
  std::string json_path;
  bool quick = false;
  app.add_option("--threads", threads, "threads for OpenMP and the BLAS (0: all cores or OMP_NUM_THREADS)");
  app.add_option("--repeats", reps, "timed repetitions per size (the median is reported)")->capture_default_str();
  app.add_option("--json", json_path, "also write {fp32_gflops, bf16_gflops, threads, sizes} to this file");
  app.add_flag("--quick", quick, "small sizes only (seconds; for tests)");
  CLI11_PARSE(app, argc, argv);
  ATOLL_CHECK(reps >= 1, "--repeats must be at least 1, got {}", reps);
  ATOLL_CHECK(threads >= 0, "--threads must be 0 (all cores) or positive, got {}", threads);
  set_num_threads(threads);

  std::vector<Shape3> shapes = {{1024, 768, 768, "attn proj"},   {1024, 2304, 768, "qkv"},
                                {1024, 3072, 768, "mlp up"},     {1024, 768, 3072, "mlp down"},
                                {2048, 2048, 2048, "square"}};
  if (quick) shapes = {{256, 256, 256, "square"}, {256, 768, 192, "qkv-ish"}};

  int64_t maxA = 0, maxB = 0, maxC = 0;
  for (auto& s : shapes) {
    maxA = std::max(maxA, s.M * s.K);
    maxB = std::max(maxB, s.K * s.N);
    maxC = std::max(maxC, s.M * s.N);
  }
  std::vector<float> A(static_cast<size_t>(maxA)), B(static_cast<size_t>(maxB)), C(static_cast<size_t>(maxC));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : A) x = u(rng);
  for (auto& x : B) x = u(rng);
  std::vector<bf16> Ah(A.size()), Bh(B.size());
  cpu::f32_to_bf16(A.data(), Ah.data(), int64_t(A.size()));
  cpu::f32_to_bf16(B.data(), Bh.data(), int64_t(B.size()));
  const bool bf16_native = cpu::has_avx512_bf16();

  std::printf("GEMM throughput, %d threads, median of %d (bf16: %s)\n", num_threads(), reps,
              bf16_native ? "AVX-512 BF16 kernel" : "no AVX-512 BF16; portable fp32 path");
  std::printf("  %-10s %6s %6s %6s %12s %12s\n", "shape", "M", "N", "K", "fp32 GF/s", "bf16 GF/s");
  double peak32 = 0, peak16 = 0;
  nlohmann::json sizes = nlohmann::json::array();
  for (auto& s : shapes) {
    const double flops = 2.0 * double(s.M) * double(s.N) * double(s.K);
    const double t32 = median_seconds(
        [&] { cpu::gemm(false, false, s.M, s.N, s.K, 1.0f, A.data(), s.K, B.data(), s.N, 0.0f, C.data(), s.N); },
        reps, 2.0);
    const double t16 = median_seconds(
        [&] {
          cpu::gemm_bf16(false, false, s.M, s.N, s.K, 1.0f, Ah.data(), s.K, Bh.data(), s.N, 0.0f, C.data(), s.N);
        },
        reps, 2.0);
    const double g32 = flops / t32 / 1e9, g16 = flops / t16 / 1e9;
    peak32 = std::max(peak32, g32);
    peak16 = std::max(peak16, g16);
    std::printf("  %-10s %6lld %6lld %6lld %12.1f %12.1f\n", s.what, (long long)s.M, (long long)s.N,
                (long long)s.K, g32, g16);
    sizes.push_back({{"M", s.M}, {"N", s.N}, {"K", s.K}, {"fp32_gflops", g32}, {"bf16_gflops", g16}});
  }
  std::printf("peak: fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s\n", peak32, peak16);

  if (!json_path.empty()) {
    nlohmann::json j;
    j["fp32_gflops"] = peak32;
    j["bf16_gflops"] = peak16;
    j["threads"] = num_threads();
    j["bf16_native"] = bf16_native;
    j["sizes"] = sizes;
    std::ofstream f(json_path);
    ATOLL_CHECK(f.good(), "cannot open '{}' for writing", json_path);
    f << j.dump(2) << "\n";
    ATOLL_CHECK(f.good(), "failed writing '{}'", json_path);
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}

Registrar bench_gemm_cmd({"bench gemm", "measure fp32/bf16 GEMM GFLOP/s (the peak MFU is computed against)",
                          run_bench_gemm});

}  // namespace

}  // namespace atl::cli
