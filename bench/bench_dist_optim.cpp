// Optimizer step time of the distributed Muon family (parallel/muon_owner, prmuon_sharded,
// dion3_dist) against AdamW on the parameter shapes of GPT-2 d=384/L=6, on N ranks:
//
//   atoll launch --nproc-per-node 2 ./bench_dist_optim [--steps N] [--threads T] [--d 384 --layers 6]
//
// (run alone it is world size 1). Hidden matrices go to the optimizer under test, everything else
// (embeddings, position table, gains, biases) to AdamW, as the usual Muon set-up; "adamw" is
// AdamW on everything, which is what every rank of DDP runs. Gradients are already averaged (DDP)
// except for muon-owner-reduce, whose step includes the reduce-scatter that delivers each matrix's
// gradient to its owner (it replaces DDP's all-reduce of those gradients, so it is not free). A
// step's time is the slowest rank's (all_reduce max), each step after a barrier; the median of
// --steps steps after one warm-up is printed.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>

#include "comm/communicator.h"
#include "core/threads.h"
#include "optim/adamw.h"
#include "optim/muon.h"
#include "optim/periodic_row_muon.h"
#include "parallel/dion3_dist.h"
#include "parallel/muon_owner.h"
#include "parallel/prmuon_sharded.h"
#include "tensor/rng.h"

using namespace atl;
using Clock = std::chrono::steady_clock;

namespace {

struct Params {
  std::vector<ParamRef> hidden, rest;
};

Params gpt2_params(int64_t d, int64_t layers, int64_t vocab = 50257, int64_t ctx = 1024) {
  std::vector<std::pair<std::string, Shape>> spec = {{"transformer.wte.weight", {vocab, d}},
                                                     {"transformer.wpe.weight", {ctx, d}}};
  for (int64_t l = 0; l < layers; ++l) {
    std::string h = "transformer.h." + std::to_string(l) + ".";
    for (auto& [n, s] : std::vector<std::pair<std::string, Shape>>{
             {"ln_1.weight", {d}}, {"ln_1.bias", {d}}, {"attn.c_attn.weight", {d, 3 * d}}, {"attn.c_attn.bias", {3 * d}},
             {"attn.c_proj.weight", {d, d}}, {"attn.c_proj.bias", {d}}, {"ln_2.weight", {d}}, {"ln_2.bias", {d}},
             {"mlp.c_fc.weight", {d, 4 * d}}, {"mlp.c_fc.bias", {4 * d}}, {"mlp.c_proj.weight", {4 * d, d}},
             {"mlp.c_proj.bias", {d}}})
      spec.push_back({h + n, s});
  }
  spec.push_back({"transformer.ln_f.weight", {d}});
  spec.push_back({"transformer.ln_f.bias", {d}});
  Rng rng(1);  // same on every rank: replicated parameters and (averaged) gradients
  Params ps;
  for (auto& [n, s] : spec) {
    ParamRef p{n, Tensor::empty(s), Tensor::empty(s)};
    rng.fill_normal(p.value, 0.f, 0.02f);
    rng.fill_normal(p.grad, 0.f, 1e-3f);
    bool hidden = s.size() == 2 && n.find("wte") == std::string::npos && n.find("wpe") == std::string::npos;
    (hidden ? ps.hidden : ps.rest).push_back(p);
  }
  return ps;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"distributed optimizer step time"};
  int steps = 8, threads = 1;
  int64_t d = 384, layers = 6;
  app.add_option("--steps", steps, "timed steps (median reported)");
  app.add_option("--threads", threads, "threads per rank");
  app.add_option("--d", d, "model width");
  app.add_option("--layers", layers, "transformer blocks");
  std::string ns_precision = "f32";
  bool ns_gram = false;
  app.add_option("--ns-precision", ns_precision, "Newton-Schulz precision: f32 | bf16");
  app.add_flag("--ns-gram", ns_gram, "Gram Newton-Schulz on matrices at least 2x wider than tall");
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(threads);
    auto comm = comm::make_communicator("auto");
    const int rank = comm->rank(), world = comm->size();
    Params ps = gpt2_params(d, layers);
    int64_t nh = 0, nr = 0;
    for (auto& p : ps.hidden) nh += p.value.numel();
    for (auto& p : ps.rest) nr += p.value.numel();

    auto time_steps = [&](const std::string& label, const std::function<void()>& step, int n) {
      step();  // warm-up (allocations, first touch)
      std::vector<double> t;
      for (int s = 0; s < n; ++s) {
        comm->barrier();
        auto t0 = Clock::now();
        step();
        Tensor x = Tensor::full({1}, float(std::chrono::duration<double>(Clock::now() - t0).count()));
        comm->all_reduce(x, comm::ReduceOp::max);
        t.push_back(double(x.f32()[0]) * 1e3);
      }
      double m = median(t);
      if (rank == 0)
        fmt::print("{:<24} {:9.2f} ms  (min {:.2f}, max {:.2f})\n", label, m, *std::min_element(t.begin(), t.end()),
                   *std::max_element(t.begin(), t.end()));
      return m;
    };
    if (rank == 0)
      fmt::print("GPT-2 d={} L={}: {:.1f}M in {} hidden matrices, {:.1f}M elsewhere; {} rank(s) x {} thread(s), "
                 "Newton-Schulz {}{}, median of {} steps (slowest rank per step)\n",
                 d, layers, double(nh) / 1e6, ps.hidden.size(), double(nr) / 1e6, world, threads, ns_precision,
                 ns_gram ? " gram" : "", steps);

    AdamWConfig ac;
    std::vector<ParamRef> all = ps.hidden;
    all.insert(all.end(), ps.rest.begin(), ps.rest.end());
    AdamW adamw_all(all, ac), adamw_rest(ps.rest, ac);
    const StepContext ctx{1.f, 1.f};
    double t_adam = time_steps("adamw (all params)", [&] { adamw_all.step(ctx); }, steps);

    MuonConfig mc;
    mc.ns.precision = optim::parse_ns_precision(ns_precision);
    mc.ns.gram = ns_gram;
    mc.ns.gram_min_aspect = 2.f;
    Muon muon_every(ps.hidden, mc);
    time_steps("muon (all on every rank)", [&] { muon_every.step(ctx); adamw_rest.step(ctx); }, std::max(2, steps / 2));
    parallel::MuonOwner owner(ps.hidden, {mc, false}, comm.get());
    double t_owner = time_steps("muon-owner + adamw", [&] { owner.step(ctx); adamw_rest.step(ctx); }, steps);
    parallel::MuonOwner owner_red(ps.hidden, {mc, true}, comm.get());
    time_steps("muon-owner-reduce + adamw", [&] { owner_red.step(ctx); adamw_rest.step(ctx); }, steps);
    if (rank == 0)
      fmt::print("  owner loads (elements): {}; all_gather padding {:.1f}%\n", fmt::join(owner.packing().load, ", "),
                 100 * owner.packing().padding_fraction());

    PeriodicRowMuonConfig pc;
    pc.muon = mc;
    pc.period = 4;
    parallel::PrMuonSharded prm(ps.hidden, {pc, false, int64_t(1) << 22}, comm.get());
    // K = 4: one refresh in every 4 steps; time 4k steps so the median covers the mix per group.
    std::vector<double> per4;
    for (int g = 0; g < std::max(2, steps / 2); ++g) {
      comm->barrier();
      auto t0 = Clock::now();
      for (int s = 0; s < 4; ++s) {
        prm.step(ctx);
        adamw_rest.step(ctx);
      }
      Tensor x = Tensor::full({1}, float(std::chrono::duration<double>(Clock::now() - t0).count() / 4));
      comm->all_reduce(x, comm::ReduceOp::max);
      per4.push_back(double(x.f32()[0]) * 1e3);
    }
    if (rank == 0) fmt::print("{:<24} {:9.2f} ms  (mean over each K=4 cycle, median of {} cycles)\n",
                              "prmuon-sharded-k4 + adamw", median(per4), per4.size());

    Dion3Config dc;
    dc.fraction = 0.25f;
    dc.ns = mc.ns;
    parallel::Dion3Dist dion(ps.hidden, dc, parallel::SelectScope::global, comm.get());
    time_steps("dion3-global-a0.25 + adamw", [&] { dion.step(ctx); adamw_rest.step(ctx); }, steps);

    if (rank == 0)
      fmt::print("distributed muon / adamw = {:.2f} (target <= 1.3 on 2 ranks)\n", t_owner / t_adam);
    comm->barrier();
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_dist_optim: {}\n", e.what());
    return 1;
  }
  return 0;
}
