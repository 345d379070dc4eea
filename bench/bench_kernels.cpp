// Plain-timing benchmark of the fused CPU kernels at GPT-2 small shapes: attention forward and
// backward (B=4, T=256, H=12, hd=64), layernorm, GELU, row softmax (attention-score rows) and fused
// cross-entropy (V=50257).
// usage: bench_kernels [threads]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <vector>

#include "core/threads.h"
#include "kernels/cpu/attention_bf16.h"
#include "kernels/cpu/gelu_paths.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/op_set.h"

namespace {

double cpu_now_ms() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Median wall milliseconds; also prints the median CPU milliseconds (all threads), which shows
// how much of the wall time the process actually ran on a shared machine.
template <typename F>
double median_ms(F&& f, int reps = 7) {
  f();
  std::vector<double> t, c;
  for (int r = 0; r < reps; ++r) {
    const auto a = std::chrono::steady_clock::now();
    const double ca = cpu_now_ms();
    f();
    c.push_back(cpu_now_ms() - ca);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  std::sort(c.begin(), c.end());
  std::printf("    [wall %.3f ms, cpu %.3f ms]\n", t[t.size() / 2], c[c.size() / 2]);
  return t[t.size() / 2];
}

std::vector<float> rnd(size_t n, float s = 1.0f) {
  static std::mt19937 rng(1);
  std::normal_distribution<float> d(0.0f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace atl;
  set_num_threads(argc > 1 ? std::atoi(argv[1]) : 0);
  std::printf("threads %d\n", num_threads());

  {
    const int64_t B = 4, T = 256, H = 12, KV = 12, hd = 64, S = (H + 2 * KV) * hd;
    auto qkv = rnd(B * T * S), dout = rnd(B * T * H * hd);
    std::vector<float> out(B * T * H * hd), lse(B * H * T), dqkv(qkv.size(), 0.0f);
    const double fwd = median_ms([&] { cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, KV, hd); });
    const double bwd = median_ms([&] {
      cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, H, KV, hd);
    });
    // Causal useful FLOPs: QKᵀ and PV over the lower triangle, 2·2·B·H·hd·T(T+1)/2 forward.
    const double f = 2.0 * 2.0 * B * H * hd * (T * (T + 1) / 2.0);
    std::printf("attention B=%lld T=%lld H=%lld hd=%lld  fwd %8.3f ms (%5.1f GFLOP/s)  bwd %8.3f ms (%5.1f GFLOP/s)\n",
                (long long)B, (long long)T, (long long)H, (long long)hd, fwd, f / fwd / 1e6, bwd,
                2.5 * f / bwd / 1e6);
  }
  {
    // The bf16 kernels (bf16 mixed precision) at d384's layer shape, against the fp32 ones.
    const int64_t B = 8, T = 256, H = 6, hd = 64, S = 3 * H * hd;
    auto qkv = rnd(B * T * S), dout = rnd(B * T * H * hd);
    std::vector<float> out(B * T * H * hd), lse(B * H * T), dqkv(qkv.size(), 0.0f);
    std::vector<bf16> packed(qkv.size());
    const double f = 2.0 * 2.0 * B * H * hd * (T * (T + 1) / 2.0);
    const double f32f = median_ms([&] { cpu::attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, H, hd); });
    const double f32b = median_ms([&] {
      cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), B, T, H, H, hd);
    });
    std::printf("attention f32  B=%lld T=%lld H=%lld hd=%lld  fwd %8.3f ms (%5.1f GFLOP/s)  bwd %8.3f ms\n",
                (long long)B, (long long)T, (long long)H, (long long)hd, f32f, f / f32f / 1e6, f32b);
    if (cpu::attention_bf16_supported()) {
      const double pk = median_ms([&] { cpu::attention_bf16_pack(packed.data(), qkv.data(), B, T, H, hd); });
      const double bf = median_ms([&] { cpu::attention_bf16_forward(out.data(), lse.data(), packed.data(), B, T, H, hd); });
      const double bb = median_ms(
          [&] { cpu::attention_bf16_backward(dqkv.data(), dout.data(), packed.data(), lse.data(), B, T, H, hd); });
      std::printf("attention bf16 B=%lld T=%lld H=%lld hd=%lld  pack %6.3f ms  fwd %8.3f ms (%5.1f GFLOP/s)  bwd %8.3f ms\n",
                  (long long)B, (long long)T, (long long)H, (long long)hd, pk, bf, f / bf / 1e6, bb);
    }
    if (std::getenv("ATOLL_BENCH_ATTN_ONLY")) return 0;
  }
  {
    const int64_t N = 4 * 256, C = 768;
    auto x = rnd(N * C), w = rnd(C), b = rnd(C), dy = rnd(N * C);
    std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
    const double fwd = median_ms(
        [&] { cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C, 1e-5f); });
    const double bwd = median_ms([&] {
      cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(), mean.data(),
                              rstd.data(), N, C);
    });
    std::printf("layernorm N=%lld C=%lld                 fwd %8.3f ms  bwd %8.3f ms\n", (long long)N, (long long)C,
                fwd, bwd);
  }
  {
    const int64_t n = 4 * 256 * 3072;
    auto x = rnd(n), dy = rnd(n);
    std::vector<float> y(n), dx(n, 0.0f);
    const double fwd = median_ms([&] { cpu::gelu_forward(y.data(), x.data(), n); });
    const double bwd = median_ms([&] { cpu::gelu_backward(dx.data(), dy.data(), x.data(), n); });
    std::printf("gelu n=%lld                          fwd %8.3f ms  bwd %8.3f ms\n", (long long)n, fwd, bwd);
    // Both compiled variants (gelu_paths.h), alternating call by call so that load changes hit them
    // alike; CPU milliseconds (one thread's work is what the variants change; wall time is noise
    // on a shared machine).
    if (cpu::isa_supported(cpu::Isa::avx512)) {
      std::vector<double> t[4];
      auto cpu_ms = [](auto&& f) {
        const double a = cpu_now_ms();
        f();
        return cpu_now_ms() - a;
      };
      for (int r = 0; r < 15; ++r) {
        t[0].push_back(cpu_ms([&] { cpu::gelu_avx2::forward(y.data(), x.data(), n); }));
        t[1].push_back(cpu_ms([&] { cpu::gelu_avx512::forward(y.data(), x.data(), n); }));
        t[2].push_back(cpu_ms([&] { cpu::gelu_avx2::backward(dx.data(), dy.data(), x.data(), n); }));
        t[3].push_back(cpu_ms([&] { cpu::gelu_avx512::backward(dx.data(), dy.data(), x.data(), n); }));
      }
      for (auto& v : t) std::sort(v.begin(), v.end());
      std::printf("gelu variants n=%lld cpu ms (median of 15, alternating): avx2 fwd %.3f bwd %.3f | avx512 fwd %.3f "
                  "bwd %.3f\n",
                  (long long)n, t[0][7], t[2][7], t[1][7], t[3][7]);
    }
  }
  {
    const int64_t N = 4 * 12 * 256, C = 256;
    auto x = rnd(N * C), dy = rnd(N * C);
    std::vector<float> y(N * C), dx(N * C, 0.0f);
    const double fwd = median_ms([&] { cpu::softmax_forward(y.data(), x.data(), N, C, false); });
    const double bwd = median_ms([&] { cpu::softmax_backward(dx.data(), dy.data(), y.data(), N, C, false); });
    std::printf("softmax N=%lld C=%lld                 fwd %8.3f ms  bwd %8.3f ms\n", (long long)N, (long long)C,
                fwd, bwd);
  }
  {
    const int64_t N = 4 * 256, V = 50257;
    auto logits = rnd(N * V, 2.0f), dl = rnd(N);
    std::vector<int32_t> tgt(N);
    for (int64_t i = 0; i < N; ++i) tgt[i] = int32_t((i * 7919) % V);
    std::vector<float> loss(N), lse(N), d(N * V);
    const double fwd = median_ms(
        [&] { cpu::crossentropy_forward(loss.data(), lse.data(), logits.data(), tgt.data(), N, V); }, 5);
    const double bwd = median_ms(
        [&] { cpu::crossentropy_backward(d.data(), dl.data(), logits.data(), lse.data(), tgt.data(), N, V); }, 5);
    std::printf("crossentropy N=%lld V=%lld            fwd %8.3f ms  bwd %8.3f ms\n", (long long)N, (long long)V,
                fwd, bwd);
  }
  return 0;
}
