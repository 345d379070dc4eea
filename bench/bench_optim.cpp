// Optimizer step time on the parameter shapes of GPT-2 d=384/L=6 and GPT-2 124M (d=768/L=12),
// and Gram vs plain Newton-Schulz on wide matrices (time and orthogonality error).
//
//   bench_optim [--model small|124m|all] [--steps N] [--ns] [--only adamw,muon,...] [--threads T]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/config.h"
#include "core/threads.h"
#include "kernels/cpu/gemm.h"
#include "optim/newton_schulz.h"
#include "optim/param_groups.h"
#include "tensor/rng.h"

using namespace atl;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::vector<ParamRef> gpt2_params(int64_t d, int64_t layers, int64_t vocab = 50257, int64_t ctx = 1024) {
  std::vector<std::pair<std::string, Shape>> spec = {{"transformer.wte.weight", {vocab, d}},
                                                     {"transformer.wpe.weight", {ctx, d}}};
  for (int64_t l = 0; l < layers; ++l) {
    std::string h = "transformer.h." + std::to_string(l) + ".";
    spec.push_back({h + "ln_1.weight", {d}});
    spec.push_back({h + "ln_1.bias", {d}});
    spec.push_back({h + "attn.c_attn.weight", {d, 3 * d}});
    spec.push_back({h + "attn.c_attn.bias", {3 * d}});
    spec.push_back({h + "attn.c_proj.weight", {d, d}});
    spec.push_back({h + "attn.c_proj.bias", {d}});
    spec.push_back({h + "ln_2.weight", {d}});
    spec.push_back({h + "ln_2.bias", {d}});
    spec.push_back({h + "mlp.c_fc.weight", {d, 4 * d}});
    spec.push_back({h + "mlp.c_fc.bias", {4 * d}});
    spec.push_back({h + "mlp.c_proj.weight", {4 * d, d}});
    spec.push_back({h + "mlp.c_proj.bias", {d}});
  }
  spec.push_back({"transformer.ln_f.weight", {d}});
  spec.push_back({"transformer.ln_f.bias", {d}});
  Rng rng(1);
  std::vector<ParamRef> ps;
  for (auto& [n, s] : spec) {
    // Roles as a GPT declares them: the token and position tables are embeddings.
    bool table = n.find("wte") != std::string::npos || n.find("wpe") != std::string::npos;
    ParamRef p{n, Tensor::empty(s), Tensor::empty(s), table ? ParamRole::embedding : ParamRole::automatic};
    rng.fill_normal(p.value, 0.f, 0.02f);
    rng.fill_normal(p.grad, 0.f, 1e-3f);
    ps.push_back(p);
  }
  return ps;
}

struct Setup {
  std::string label, toml;
};

void bench_model(const std::string& model, int steps, const std::vector<std::string>& only) {
  const bool big = model == "124m";
  const int64_t d = big ? 768 : 384, L = big ? 12 : 6;
  auto params = gpt2_params(d, L);
  int64_t nparam = 0;
  for (auto& p : params) nparam += p.value.numel();
  fmt::print("\nGPT-2 d={} L={} ({:.1f}M parameters), {} timed steps after 1 warm-up, {} threads\n", d, L,
             double(nparam) / 1e6, steps, num_threads());
  const std::vector<Setup> setups = {
      {"adamw", "[optim]\ntype = \"adamw\"\n"},
      {"muon", "[optim]\ntype = \"muon\"\n"},
      {"muon-gram", "[optim]\ntype = \"muon\"\n[optim.muon]\nns_gram = true\n"},
      {"prmuon-k4", "[optim]\ntype = \"prmuon\"\n[optim.prmuon]\nperiod = 4\n"},
      {"prmuon-k8", "[optim]\ntype = \"prmuon\"\n[optim.prmuon]\nperiod = 8\n"},
      {"dion3-a0.25", "[optim]\ntype = \"dion3\"\n[optim.dion3]\nfraction = 0.25\n"},
      {"soap", "[optim]\ntype = \"soap\"\n"},
      {"muon+ember", "[optim]\ntype = \"muon\"\nembed = \"ember\"\n"},
      {"adamw+ember", "[optim]\ntype = \"adamw\"\nembed = \"ember\"\n"},
      {"adams", "[optim]\ntype = \"adams\"\n"},
      {"lion", "[optim]\ntype = \"lion\"\n"},
  };
  fmt::print("{:<13} {:>11} {:>9}   per group (ms/step)\n", "optimizer", "ms/step", "vs adamw");
  double adamw_ms = 0;
  for (const auto& s : setups) {
    if (!only.empty() && std::find(only.begin(), only.end(), s.label) == only.end()) continue;
    Config cfg = Config::parse(s.toml, s.label);
    auto opt = make_optimizer(cfg, params);
    auto* g = dynamic_cast<GroupedOptimizer*>(opt.get());
    std::map<std::string, double> per_group;
    opt->step({});  // warm-up: allocations, SOAP's first eigendecomposition, a Muon-family refresh
    // Small steps so the weights do not drift far over the timed steps.
    StepContext ctx{1e-3f, 1.f};
    double total = 0;
    for (int t = 0; t < steps; ++t) {
      for (auto& grp : g->groups()) {
        auto t0 = Clock::now();
        grp.opt->step(ctx);
        double dt = seconds_since(t0);
        per_group[grp.name] += dt;
        total += dt;
      }
    }
    double ms = 1e3 * total / steps;
    if (s.label == "adamw") adamw_ms = ms;
    std::string groups;
    for (auto& [n, t] : per_group) groups += fmt::format("{} {:.1f}  ", n, 1e3 * t / steps);
    fmt::print("{:<13} {:>11.1f} {:>9}   {}\n", s.label, ms, adamw_ms > 0 ? fmt::format("{:.2f}x", ms / adamw_ms) : "-",
               groups);
    std::fflush(stdout);
  }
}

double orthogonality_error(const std::vector<float>& X, int64_t m, int64_t n) {
  std::vector<float> A(size_t(m * m));
  cpu::gemm(false, true, m, m, n, 1.f, X.data(), n, X.data(), n, 0.f, A.data(), m);
  double e = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double v = A[size_t(i * m + j)] - (i == j ? 1.0 : 0.0);
      e += v * v;
    }
  return std::sqrt(e / double(m));  // ||X X^T - I||_F / sqrt(m): RMS deviation of the singular values^2
}

void bench_ns(int reps) {
  fmt::print("\nNewton-Schulz on wide matrices (Gaussian input), best of {} runs, {} threads\n", reps, num_threads());
  fmt::print("{:<11} {:<18} {:<6} {:>9} {:>9} {:>12}\n", "shape", "schedule", "form", "ms", "GFLOP", "orth. error");
  const std::pair<int64_t, int64_t> shapes[] = {{384, 1536}, {768, 3072}, {256, 4096}, {768, 768}};
  for (auto [m, n] : shapes) {
    Tensor g = Tensor::empty({m, n});
    Rng(3).fill_normal(g, 0.f, 1.f);
    std::vector<float> out(size_t(m * n));
    for (auto [sched, steps] : {std::pair{optim::NsSchedule::quintic, 5}, std::pair{optim::NsSchedule::polar_express, 5},
                                std::pair{optim::NsSchedule::polar_express, 8}}) {
      for (bool gram : {false, true}) {
        optim::NsOptions o;
        o.schedule = sched;
        o.steps = steps;
        o.gram = gram;
        double best = 1e30;
        for (int r = 0; r < reps; ++r) {
          auto t0 = Clock::now();
          optim::orthogonalize(g.f32(), out.data(), m, n, o);
          best = std::min(best, seconds_since(t0));
        }
        fmt::print("{:<11} {:<18} {:<6} {:>9.1f} {:>9.1f} {:>12.4f}\n", fmt::format("{}x{}", m, n),
                   fmt::format("{} x{}", sched == optim::NsSchedule::quintic ? "quintic" : "polar_express", steps),
                   gram ? "gram" : "plain", 1e3 * best, optim::ns_flops(m, n, o) / 1e9, orthogonality_error(out, m, n));
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"atoll optimizer benchmarks"};
  std::string model = "small", only_s;
  int steps = 8, threads = 0, reps = 3;
  bool ns = false, no_models = false;
  app.add_option("--model", model, "small (d=384, L=6), 124m, or all")->check(CLI::IsMember({"small", "124m", "all"}));
  app.add_option("--steps", steps, "timed optimizer steps (a multiple of 8 covers PRMuon's periods)");
  app.add_option("--only", only_s, "comma-separated subset, e.g. adamw,muon");
  app.add_option("--threads", threads, "threads (0: all)");
  app.add_flag("--ns", ns, "also compare Gram and plain Newton-Schulz");
  app.add_flag("--ns-only", no_models, "only the Newton-Schulz comparison");
  app.add_option("--reps", reps, "Newton-Schulz repetitions");
  CLI11_PARSE(app, argc, argv);
  set_num_threads(threads);
  std::vector<std::string> only;
  std::stringstream ss(only_s);
  for (std::string x; std::getline(ss, x, ',');)
    if (!x.empty()) only.push_back(x);
  if (!no_models) {
    if (model == "small" || model == "all") bench_model("small", steps, only);
    if (model == "124m" || model == "all") bench_model("124m", steps, only);
  }
  if (ns || no_models) bench_ns(reps);
  return 0;
}
