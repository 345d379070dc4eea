// `atoll bench gemm`: the GEMM throughput this machine actually reaches on every kernel path it
// supports (fp32: OpenBLAS and oneDNN; bf16: widened to fp32, AVX-512 BF16, oneDNN on AMX; int8:
// oneDNN), over the training's real shapes: for each linear layer of the model its forward
// (x·W), dX (dY·Wᵀ) and dW (xᵀ·dY) products. It prints the ISA detected at run time first. The
// trainer divides its model FLOP/s by the peak of the path in use to report MFU.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "cli/command.h"
#include "core/error.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"
#include "train/gemm_peak_cache.h"

namespace atl::cli {

namespace {

struct Shape3 {
  int64_t M, N, K;
  bool ta, tb;
  std::string what;
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

// A linear layer y[N,OC] = x[N,C]·W[C,OC] gives three products; `wt` for weights stored [OC,C]
// (the tied LM head, linear_t).
void linear_shapes(std::vector<Shape3>& v, const std::string& name, int64_t N, int64_t C, int64_t OC, bool wt) {
  v.push_back({N, OC, C, false, wt, name + " fwd"});
  v.push_back({N, C, OC, false, !wt, name + " dX"});
  if (wt) v.push_back({OC, C, N, true, false, name + " dW"});
  else v.push_back({C, OC, N, true, false, name + " dW"});
}

std::vector<Shape3> model_shapes(int64_t rows, int64_t C, int64_t V) {
  std::vector<Shape3> v;
  linear_shapes(v, "qkv", rows, C, 3 * C, false);
  linear_shapes(v, "attn proj", rows, C, C, false);
  linear_shapes(v, "mlp up", rows, C, 4 * C, false);
  linear_shapes(v, "mlp down", rows, 4 * C, C, false);
  linear_shapes(v, "lm head", rows, C, V, true);
  v.push_back({2048, 2048, 2048, false, false, "square"});
  return v;
}

int run_bench_gemm(int argc, char** argv) {
  CLI::App app{"Measure GEMM throughput (GFLOP/s) of every kernel path this CPU supports on the training's shapes"};
  int threads = 0, reps = 5;
  std::string json_path, model = "d384";
  bool quick = false;
  app.add_option("--threads", threads, "threads for OpenMP and the BLAS (0: all cores or OMP_NUM_THREADS)");
  app.add_option("--repeats", reps, "timed repetitions per size (the median is reported)")->capture_default_str();
  app.add_option("--json", json_path, "also write {isa, fp32_gflops, bf16_gflops, threads, sizes} to this file");
  app.add_option("--model", model, "shapes of: d384 (d=384, V=8192, B*T=2048) or gpt2 (124M, B*T=1024)")
      ->check(CLI::IsMember({"d384", "gpt2"}))
      ->capture_default_str();
  app.add_flag("--quick", quick, "small sizes only (seconds; for tests)");
  bool save = false;
  app.add_flag("--save", save,
               "cache the peaks for this CPU, ISA path and thread count; `atoll train` reads them instead of "
               "measuring at start-up (file: ATOLL_PEAK_CACHE, else ~/.cache/atoll/gemm_peaks.json)");
  CLI11_PARSE(app, argc, argv);
  ATOLL_CHECK(reps >= 1, "--repeats must be at least 1, got {}", reps);
  ATOLL_CHECK(!(save && quick), "--save with --quick: the quick sizes are too small to give the peak; drop --quick");
  ATOLL_CHECK(threads >= 0, "--threads must be 0 (all cores) or positive, got {}", threads);
  set_num_threads(threads);
  std::printf("%s\n", cpu::select_isa("auto", "atoll bench gemm").c_str());
  std::printf("%s; fp32 gemm: %s, bf16 gemm: %s, int8 gemm: %s\n", cpu::onednn_version().c_str(), cpu::gemm_path(),
              cpu::gemm_bf16_path(), cpu::gemm_s8_path());

  std::vector<Shape3> shapes = model == "gpt2" ? model_shapes(1024, 768, 50257) : model_shapes(2048, 384, 8192);
  if (quick) shapes = {{256, 256, 256, false, false, "square"}, {256, 192, 768, false, true, "dX-ish"},
                       {192, 96, 256, true, false, "dW-ish"}};

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
  std::vector<int8_t> A8(A.size()), B8(B.size());
  std::vector<int32_t> C32(C.size());
  for (size_t i = 0; i < A.size(); ++i) A8[i] = int8_t(A[i] * 127.0f);
  for (size_t i = 0; i < B.size(); ++i) B8[i] = int8_t(B[i] * 127.0f);

  // The columns: every path this CPU can run, the active one of each dtype first.
  struct Path {
    std::string name;
    std::function<void(const Shape3&)> run;
  };
  std::vector<Path> paths;
  using cpu::Isa;
  paths.push_back({"fp32 openblas", [&](const Shape3& s) {
                     cpu::gemm_openblas(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), s.ta ? s.M : s.K, B.data(),
                                        s.tb ? s.K : s.N, 0.0f, C.data(), s.N);
                   }});
  paths.push_back({"fp32 onednn", [&](const Shape3& s) {
                     cpu::gemm_onednn(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), s.ta ? s.M : s.K, B.data(),
                                      s.tb ? s.K : s.N, 0.0f, C.data(), s.N);
                   }});
  paths.push_back({"bf16 portable", [&](const Shape3& s) {
                     cpu::gemm_bf16_portable(s.ta, s.tb, s.M, s.N, s.K, 1.0f, Ah.data(), s.ta ? s.M : s.K,
                                             Bh.data(), s.tb ? s.K : s.N, 0.0f, C.data(), s.N);
                   }});
  if (cpu::isa_supported(Isa::avx512_bf16))
    paths.push_back({"bf16 avx512_bf16", [&](const Shape3& s) {
                       cpu::gemm_bf16_avx512(s.ta, s.tb, s.M, s.N, s.K, 1.0f, Ah.data(), s.ta ? s.M : s.K,
                                             Bh.data(), s.tb ? s.K : s.N, 0.0f, C.data(), s.N);
                     }});
  // oneDNN has bf16 matmul kernels from AVX-512 up (a forced lower path also bounds oneDNN).
  if (cpu::active_isa() >= Isa::avx512)
    paths.push_back({"bf16 onednn", [&](const Shape3& s) {
                       cpu::gemm_bf16_onednn(s.ta, s.tb, s.M, s.N, s.K, 1.0f, Ah.data(), s.ta ? s.M : s.K,
                                             Bh.data(), s.tb ? s.K : s.N, 0.0f, C.data(), s.N);
                     }});
  if (cpu::isa_supported(Isa::amx))
    paths.push_back({"bf16 amx", [&](const Shape3& s) {
                       cpu::gemm_bf16_amx(s.ta, s.tb, s.M, s.N, s.K, 1.0f, Ah.data(), s.ta ? s.M : s.K, Bh.data(),
                                          s.tb ? s.K : s.N, 0.0f, C.data(), s.N);
                     }});
  if (std::string(cpu::gemm_s8_path()) == "onednn")
    paths.push_back({"int8 onednn", [&](const Shape3& s) {
                       cpu::gemm_s8_onednn(s.ta, s.tb, s.M, s.N, s.K, A8.data(), s.ta ? s.M : s.K, B8.data(),
                                           s.tb ? s.K : s.N, C32.data(), s.N);
                     }});

  std::printf("GEMM throughput in GFLOP/s (GOP/s for int8), %d threads, median of %d\n", num_threads(), reps);
  std::printf("  %-14s %5s %5s %5s %2s%2s", "shape", "M", "N", "K", "tA", "tB");
  for (auto& p : paths) std::printf(" %17s", p.name.c_str());
  std::printf("\n");
  std::vector<double> peak(paths.size(), 0.0);
  nlohmann::json sizes = nlohmann::json::array();
  for (auto& s : shapes) {
    const double flops = 2.0 * double(s.M) * double(s.N) * double(s.K);
    std::printf("  %-14s %5lld %5lld %5lld %2d%2d", s.what.c_str(), (long long)s.M, (long long)s.N, (long long)s.K,
                int(s.ta), int(s.tb));
    nlohmann::json row = {{"shape", s.what}, {"M", s.M}, {"N", s.N}, {"K", s.K}, {"ta", s.ta}, {"tb", s.tb}};
    for (size_t i = 0; i < paths.size(); ++i) {
      const double g = flops / median_seconds([&] { paths[i].run(s); }, reps, 2.0) / 1e9;
      peak[i] = std::max(peak[i], g);
      std::printf(" %17.1f", g);
      row[paths[i].name] = g;
    }
    std::printf("\n");
    std::fflush(stdout);
    sizes.push_back(row);
  }
  const std::string bf16_path = cpu::gemm_bf16_path();
  const std::string bf16_col = bf16_path.rfind("onednn", 0) == 0 ? "bf16 onednn"
                               : bf16_path == "avx512_bf16"     ? "bf16 avx512_bf16"
                                                                : "bf16 portable";
  double peak32 = 0;  // fp32's library is chosen per product (gemm_f32_select.cpp)
  for (size_t i = 0; i < sizes.size(); ++i) {  // the paths in use, under the names the trainer and tests read
    auto& row = sizes[i];
    const Shape3& s = shapes[i];
    row["fp32_gflops"] = row[std::string("fp32 ") + cpu::gemm_f32_choice(s.ta, s.tb, s.M, s.N, s.K)];
    row["bf16_gflops"] = row[bf16_col];
    peak32 = std::max(peak32, row["fp32_gflops"].get<double>());
  }
  // The peaks MFU is taken against: the best shape of the path each dtype uses now.
  auto peak_of = [&](const std::string& name) {
    for (size_t i = 0; i < paths.size(); ++i)
      if (paths[i].name == name) return peak[i];
    return 0.0;
  };
  const double peak16 = peak_of(bf16_col);
  std::printf("peak of the paths in use: fp32 (%s) %.1f GFLOP/s, bf16 (%s) %.1f GFLOP/s\n", cpu::gemm_path(), peak32,
              bf16_path.c_str(), peak16);

  if (!json_path.empty()) {
    nlohmann::json j;
    j["cpu"] = cpu::cpu_features().model;
    j["isa"] = cpu::isa_name(cpu::active_isa());
    j["bf16_path"] = bf16_path;
    j["fp32_gemm"] = cpu::gemm_f32_setting();  // per shape, "fp32_gflops" is the library this setting takes
    j["bf16_gemm"] = cpu::gemm_bf16_setting();
    j["fp32_gflops"] = peak32;
    j["bf16_gflops"] = peak16;
    j["threads"] = num_threads();
    j["bf16_native"] = bf16_path != "portable";
    j["sizes"] = sizes;
    std::ofstream f(json_path);
    ATOLL_CHECK(f.good(), "cannot open '{}' for writing", json_path);
    f << j.dump(2) << "\n";
    ATOLL_CHECK(f.good(), "failed writing '{}'", json_path);
    std::printf("wrote %s\n", json_path.c_str());
  }
  if (save) {
    const std::string cache = gemm_peak_cache_path();
    save_gemm_peak(cache, current_gemm_peak_key(num_threads()), peak32, peak16, bf16_path);
    std::printf("saved the peaks for %s, %s, %d threads, fp32 gemm %s in %s\n", cpu::cpu_features().model.c_str(),
                cpu::isa_name(cpu::active_isa()), num_threads(), cpu::gemm_f32_setting(), cache.c_str());
  }
  return 0;
}

Registrar bench_gemm_cmd({"bench gemm", "measure GEMM GFLOP/s of every kernel path (the peak MFU is computed against)",
                          run_bench_gemm});

}  // namespace

}  // namespace atl::cli
