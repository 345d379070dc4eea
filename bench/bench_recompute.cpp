// Activation recomputation ([train] recompute, autograd/checkpoint.h): atoll's full training step
// (forward, backward, clip, AdamW) under recompute = none, selective and full on one GPT, and for
// each one JSON line: the median step time, the peak bytes held by tensors during a step above
// what lives between steps (the allocator's high-water mark: activations and gradients in
// flight), and the process's peak RSS (run one MODE per process for a per-mode RSS). The loss of
// each mode is printed too: it must be identical.
// usage: bench_recompute PRESET B T THREADS STEPS [MODE|all [n_layer n_embd n_head vocab]]
// (bench/recompute_vs_torch.sh runs it beside PyTorch's torch.utils.checkpoint.)
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "autograd/graph.h"
#include "core/threads.h"
#include "models/gpt/gpt.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tensor/allocator.h"

using namespace atl;

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s PRESET B T THREADS STEPS [n_layer n_embd n_head vocab]\n", argv[0]);
    return 1;
  }
  nn::GPTConfig cfg = nn::GPTConfig::preset(argv[1]);
  const int64_t B = std::atoll(argv[2]), T = std::atoll(argv[3]);
  const int threads = std::atoi(argv[4]), steps = std::atoi(argv[5]);
  const std::string only = argc >= 7 ? argv[6] : "all";
  if (argc >= 11) {
    cfg.n_layer = std::atoll(argv[7]);
    cfg.n_embd = std::atoll(argv[8]);
    cfg.n_head = cfg.n_kv_head = std::atoll(argv[9]);
    cfg.vocab_size = std::atoll(argv[10]);
  }
  cfg.block_size = std::max(cfg.block_size, T);
  set_num_threads(threads);
  Rng rng(7, 0);
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  for (auto& t : tok) t = int32_t(rng.below(uint64_t(cfg.vocab_size)));
  for (auto& t : tgt) t = int32_t(rng.below(uint64_t(cfg.vocab_size)));
  Tensor x = Tensor::from_vector_i32(tok, {B, T}), y = Tensor::from_vector_i32(tgt, {B, T});
  Allocator& alloc = allocator_for(Device::cpu());
  for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
    if (only != "all" && only != recompute_name(mode)) continue;
    nn::GPT model(cfg);
    model.init_weights(1);
    model.set_recompute(std::vector<Recompute>(size_t(cfg.n_layer), mode));
    AdamW opt(model.param_refs(), AdamWConfig{});
    std::vector<double> times;
    double loss = 0;
    size_t peak = 0, base = 0;
    for (int s = 0; s < steps + 1; ++s) {
      base = alloc.stats().current_bytes;  // weights, gradients, optimizer state
      alloc.reset_peak();
      auto t0 = std::chrono::steady_clock::now();
      model.zero_grad();
      Tensor l = model.loss(x, y);
      backward(l);
      opt.step({1.f, clip_coefficient(grad_norm(model.flat_grads()), 1.f)});
      loss = l.item();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > 0) times.push_back(dt);  // the first step warms the allocator's cache
      peak = std::max(peak, alloc.stats().peak_bytes - base);
    }
    std::sort(times.begin(), times.end());
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    nlohmann::json j = {{"impl", "atoll"},        {"recompute", recompute_name(mode)},
                        {"step_s", times[times.size() / 2]}, {"peak_activation_bytes", peak},
                        {"resident_bytes", base}, {"max_rss_bytes", int64_t(ru.ru_maxrss) * 1024}, {"loss", loss}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}
