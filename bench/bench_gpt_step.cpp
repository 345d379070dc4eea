// Times atoll's full training step (forward, backward, clip, AdamW) on a GPT model and prints one
// JSON line: tokens/s (median over steps), MFU against a measured GEMM peak, peak memory.
// usage: bench_gpt_step PRESET B T THREADS STEPS [n_layer n_embd n_head vocab]
// ATOLL_BENCH_DTYPE=bf16 runs the matmuls in bf16 (mixed precision, fp32 master weights).
// ATOLL_BENCH_ACCUM=k runs k micro-steps of B sequences per optimizer step (tokens/s counts all);
// ATOLL_BENCH_CAST_CACHE=0 converts weights to bf16 on every use instead of once per step.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "autograd/graph.h"
#include "autograd/precision.h"
#include "autograd/weight_cast_cache.h"
#include "core/threads.h"
#include "models/gpt/gpt.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "train/trainer.h"

using namespace atl;

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s PRESET B T THREADS STEPS [n_layer n_embd n_head vocab]\n", argv[0]);
    return 1;
  }
  nn::GPTConfig cfg = nn::GPTConfig::preset(argv[1]);
  int64_t B = std::atoll(argv[2]), T = std::atoll(argv[3]);
  int threads = std::atoi(argv[4]), steps = std::atoi(argv[5]);
  if (argc >= 10) {
    cfg.n_layer = std::atoll(argv[6]);
    cfg.n_embd = std::atoll(argv[7]);
    cfg.n_head = cfg.n_kv_head = std::atoll(argv[8]);
    cfg.vocab_size = std::atoll(argv[9]);
  }
  cfg.block_size = std::max(cfg.block_size, T);
  set_num_threads(threads);
  const char* dt = std::getenv("ATOLL_BENCH_DTYPE");
  if (dt) set_matmul_dtype(dtype_from_name(dt));
  nn::GPT model(cfg);
  model.init_weights(1);
  AdamW opt(model.param_refs(), AdamWConfig{});
  Rng rng(7, 0);
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  for (auto& t : tok) t = int32_t(rng.below(uint64_t(cfg.vocab_size)));
  for (auto& t : tgt) t = int32_t(rng.below(uint64_t(cfg.vocab_size)));
  Tensor x = Tensor::from_vector_i32(tok, {B, T}), y = Tensor::from_vector_i32(tgt, {B, T});
  const char* ac = std::getenv("ATOLL_BENCH_ACCUM");
  const int accum = ac ? std::max(1, std::atoi(ac)) : 1;
  const char* cc = std::getenv("ATOLL_BENCH_CAST_CACHE");
  const bool cast_cache = !cc || std::string(cc) != "0";
  std::vector<double> times;
  double loss = 0;
  for (int s = 0; s < steps + 1; ++s) {
    auto t0 = std::chrono::steady_clock::now();
    model.zero_grad();
    {
      std::optional<WeightCastScope> casts;
      if (cast_cache) casts.emplace();
      for (int m = 0; m < accum; ++m) {
        Tensor l = model.loss(x, y);
        backward(l, 1.f / float(accum));
        loss = l.item();
      }
    }
    opt.step({1.f, clip_coefficient(grad_norm(model.flat_grads()), 1.f)});
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) times.push_back(dt);  // the first step warms the allocator's cache
  }
  std::sort(times.begin(), times.end());
  double med = times[times.size() / 2];
  double peak = measure_gemm_peak_gflops();
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  double tps = double(B * T * accum) / med;
  nlohmann::json j = {{"impl", std::string("atoll ") + dtype_name(matmul_dtype())},
                      {"params", model.num_params()},
                      {"step_s", med},
                      {"tokens_per_s", tps},
                      {"mfu", model.flops_per_token(T) * tps / (peak * 1e9)},
                      {"gemm_peak_gflops", peak},
                      {"peak_tensor_bytes", allocator_for(Device::cpu()).stats().peak_bytes},
                      {"max_rss_bytes", int64_t(ru.ru_maxrss) * 1024},
                      {"accum", accum},
                      {"cast_cache", cast_cache},
                      {"loss", loss}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
