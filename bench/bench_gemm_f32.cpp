// fp32 GEMM: OpenBLAS (cblas_sgemm) against oneDNN's matmul on the training's real shapes, the
// measurement behind the rule in kernels/cpu/gemm.cpp that picks one of them per product. Each
// repetition runs both libraries back to back (interleaved, so that a change of machine load hits
// both alike); the median per library and the median of the per-repetition ratios are printed,
// with the CPU model, the thread count and the load average.
// usage: bench_gemm_f32 [THREADS=2] [REPEATS=7] [MODEL=d384|gpt2|both]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa.h"

namespace {

struct Shape {
  int64_t M, N, K;
  bool ta, tb;
  std::string what;
};

void linear(std::vector<Shape>& v, const std::string& p, int64_t rows, int64_t C, int64_t OC, bool wt) {
  v.push_back({rows, OC, C, false, wt, p + " fwd"});
  v.push_back({rows, C, OC, false, !wt, p + " dX"});
  v.push_back(wt ? Shape{OC, C, rows, true, false, p + " dW"} : Shape{C, OC, rows, true, false, p + " dW"});
}

std::vector<Shape> shapes(const std::string& model, int64_t rows, int64_t C, int64_t V) {
  std::vector<Shape> v;
  linear(v, model + " qkv", rows, C, 3 * C, false);
  linear(v, model + " attn proj", rows, C, C, false);
  linear(v, model + " mlp up", rows, C, 4 * C, false);
  linear(v, model + " mlp down", rows, 4 * C, C, false);
  linear(v, model + " lm head", rows, C, V, true);
  return v;
}

double seconds(const auto& f) {
  const auto a = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 7;
  const std::string model = argc > 3 ? argv[3] : "both";
  atl::set_num_threads(threads);
  std::vector<Shape> v;
  if (model == "d384" || model == "both") {
    auto s = shapes("d384", 2048, 384, 8192);
    v.insert(v.end(), s.begin(), s.end());
  }
  if (model == "gpt2" || model == "both") {
    auto s = shapes("gpt2", 1024, 768, 50257);
    v.insert(v.end(), s.begin(), s.end());
  }
  std::printf("%s\n%s; %d threads, %d interleaved repetitions, load average %s\n", atl::cpu::isa_summary().c_str(),
              atl::cpu::onednn_version().c_str(), atl::num_threads(), reps, loadavg().c_str());
  std::printf("%-22s %5s %6s %6s %2s  %9s %9s %7s  %s\n", "shape", "M", "N", "K", "tt", "openblas", "onednn",
              "dnn/obl", "rule picks");
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const Shape& s : v) {
    std::vector<float> A(size_t(s.M * s.K)), B(size_t(s.K * s.N)), C(size_t(s.M * s.N));
    for (float& x : A) x = u(rng);
    for (float& x : B) x = u(rng);
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    auto obl = [&] { atl::cpu::gemm_openblas(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), s.N); };
    auto dnn = [&] { atl::cpu::gemm_onednn(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C.data(), s.N); };
    obl();
    dnn();
    std::vector<double> to, td, ratio;
    const double flop = 2.0 * double(s.M) * double(s.N) * double(s.K);
    const int n = flop > 5e10 ? std::max(3, reps / 2) : reps;  // the GPT-2 head takes seconds
    for (int r = 0; r < n; ++r) {
      const bool first_obl = r % 2 == 0;  // alternate which goes first
      double a, b;
      if (first_obl) { a = seconds(obl); b = seconds(dnn); }
      else { b = seconds(dnn); a = seconds(obl); }
      to.push_back(a);
      td.push_back(b);
      ratio.push_back(a / b);
    }
    std::printf("%-22s %5lld %6lld %6lld %c%c  %9.1f %9.1f %7.2f  %s\n", s.what.c_str(), (long long)s.M,
                (long long)s.N, (long long)s.K, s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', flop / median(to) * 1e-9,
                flop / median(td) * 1e-9, median(ratio),
                atl::cpu::gemm_f32_choice(s.ta, s.tb, s.M, s.N, s.K));
    std::fflush(stdout);
  }
  std::printf("GFLOP/s (medians); dnn/obl = median of per-repetition oneDNN/OpenBLAS speed ratios; load average now %s\n",
              loadavg().c_str());
  return 0;
}
