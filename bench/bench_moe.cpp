// MoE training-step throughput against a dense model of equal active parameters, and the grouped
// GEMM against a loop of one GEMM per expert, in one run on one machine. Prints JSON lines and the
// ratios with the CPU model.
// usage: bench_moe [PRESET=moe-small] [B=8] [T=128] [THREADS=0] [STEPS=5]
// The dense twin keeps attention, width and depth and replaces every MoE layer by a dense FFN of
// top_k * expert_ffn + n_shared * shared_ffn hidden units (the same FFN FLOPs per token, without
// the router); all layers of the twin are dense.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "autograd/graph.h"
#include "core/threads.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/moe_kernels.h"
#include "models/moe/moe_model.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "tensor/rng.h"
#include "train/trainer.h"

using namespace atl;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

nlohmann::json time_model(const std::string& what, const nn::MoEModelConfig& cfg, int64_t B, int64_t T, int steps) {
  nn::MoEModel model(cfg);
  model.init_weights(1);
  AdamW opt(model.param_refs(), AdamWConfig{});
  Rng rng(7, 0);
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  for (auto& t : tok) t = int32_t(rng.below(uint64_t(cfg.attn.vocab_size)));
  for (auto& t : tgt) t = int32_t(rng.below(uint64_t(cfg.attn.vocab_size)));
  Tensor x = Tensor::from_vector_i32(tok, {B, T}), y = Tensor::from_vector_i32(tgt, {B, T});
  std::vector<double> times;
  for (int s = 0; s < steps + 1; ++s) {
    auto t0 = Clock::now();
    model.zero_grad();
    Tensor l = model.loss(x, y);
    backward(l);
    opt.step({1.f, clip_coefficient(grad_norm(model.flat_grads()), 1.f)});
    if (s > 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double med = median(times);
  return {{"model", what},
          {"describe", model.describe()},
          {"params", model.num_params()},
          {"active_flops_per_token", model.flops_per_token(T)},
          {"step_s", med},
          {"tokens_per_s", double(B * T) / med}};
}

// Grouped GEMM vs a loop of GEMMs on one MoE projection's shape (routed rows spread over E experts).
nlohmann::json time_grouped(int64_t rows, int64_t E, int64_t K, int64_t N, int reps) {
  Rng rng(3, 0);
  Tensor x = Tensor::empty({rows, K}), w = Tensor::empty({E, K, N}), y = Tensor::empty({rows, N});
  rng.fill_normal(x, 0.f, 1.f);
  rng.fill_normal(w, 0.f, 0.1f);
  std::vector<int64_t> off{0};
  for (int64_t e = 0; e < E; ++e) off.push_back(rows * (e + 1) / E);
  auto run = [&](auto fn) {
    std::vector<double> t;
    for (int r = 0; r < reps + 1; ++r) {
      auto t0 = Clock::now();
      fn(y.f32(), x.f32(), w.f32(), off.data(), E, K, N);
      if (r > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return median(t);
  };
  const double g = run(cpu::grouped_gemm_forward), l = run(cpu::grouped_gemm_loop);
  return {{"kernel", "grouped_gemm_forward vs loop of sgemm"}, {"rows", rows}, {"experts", E}, {"K", K}, {"N", N},
          {"grouped_ms", g * 1e3}, {"loop_ms", l * 1e3}, {"loop_over_grouped", l / g}};
}

}  // namespace

int main(int argc, char** argv) {
  const std::string preset = argc > 1 ? argv[1] : "moe-small";
  const int64_t B = argc > 2 ? std::atoll(argv[2]) : 8, T = argc > 3 ? std::atoll(argv[3]) : 128;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 0, steps = argc > 5 ? std::atoi(argv[5]) : 5;
  set_num_threads(threads);
  nn::MoEModelConfig moe = nn::MoEModelConfig::preset(preset);
  moe.attn.block_size = std::max(moe.attn.block_size, T);
  nn::MoEModelConfig dense = moe;
  dense.n_dense_layers = dense.attn.n_layer;
  const int64_t shared = moe.moe.n_shared * (moe.moe.shared_ffn > 0 ? moe.moe.shared_ffn : moe.moe.expert_ffn);
  dense.attn.ffn_hidden = moe.moe.top_k * moe.moe.expert_ffn + shared;
  // The MoE's own dense layers keep their width in the twin: only MoE layers change.
  std::printf("cpu: %s, %d threads (the machine is shared: figures are under load)\n", cpu::cpu_features().model.c_str(),
              num_threads());
  auto jm = time_model("moe", moe, B, T, steps);
  std::printf("%s\n", jm.dump().c_str());
  auto jd = time_model("dense, equal active FFN", dense, B, T, steps);
  std::printf("%s\n", jd.dump().c_str());
  std::printf("moe tokens/s over dense tokens/s: %.2f\n", double(jm["tokens_per_s"]) / double(jd["tokens_per_s"]));
  const int64_t rows = B * T * moe.moe.top_k, C = moe.attn.n_embd, F = moe.moe.expert_ffn;
  std::printf("%s\n", time_grouped(rows, moe.moe.n_experts, C, 2 * F, 10).dump().c_str());
  std::printf("%s\n", time_grouped(rows, moe.moe.n_experts, F, C, 10).dump().c_str());
  return 0;
}
