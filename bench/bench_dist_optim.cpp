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
//
// The ZeRO section (parallel/sharded_muon.h) builds the real GPT-2 d=--d/L=--layers model and its
// ZeRO data-parallel wrapper (--zero-stage, 25 MiB buckets) with AdamW (ShardedAdamW) or Muon /
// PRMuon (ShardedMuon: owners orthogonalize, two all_to_alls) on the hidden matrices, and times
// the sharded optimizer alone and dp.step() (optimizer + ZeRO's parameter all-gather or release).
// --sections dist|zero|all picks what runs.
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
#include "models/gpt/gpt.h"
#include "parallel/data_parallel.h"
#include "parallel/optim/dion3_dist.h"
#include "parallel/optim/sharded_muon.h"
#include "parallel/optim/muon_owner.h"
#include "parallel/optim/prmuon_sharded.h"
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
    // Roles as a GPT declares them: the token and position tables are embeddings.
    bool table = n.find("wte") != std::string::npos || n.find("wpe") != std::string::npos;
    ParamRef p{n, Tensor::empty(s), Tensor::empty(s), table ? ParamRole::embedding : ParamRole::automatic};
    rng.fill_normal(p.value, 0.f, 0.02f);
    rng.fill_normal(p.grad, 0.f, 1e-3f);
    bool hidden = s.size() == 2 && !table;
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
  std::string sections = "all";
  int zero_stage = 2;
  app.add_option("--sections", sections, "dist (replicated-parameter variants) | zero | all")
      ->check(CLI::IsMember({"dist", "zero", "all"}));
  app.add_option("--zero-stage", zero_stage, "ZeRO stage of the zero section (1, 2 or 3)")->check(CLI::Range(1, 3));
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
        fmt::print("{:<30} {:9.2f} ms  (min {:.2f}, max {:.2f})\n", label, m, *std::min_element(t.begin(), t.end()),
                   *std::max_element(t.begin(), t.end()));
      return m;
    };
    if (rank == 0)
      fmt::print("GPT-2 d={} L={}: {:.1f}M in {} hidden matrices, {:.1f}M elsewhere; {} rank(s) x {} thread(s), "
                 "Newton-Schulz {}{}, median of {} steps (slowest rank per step)\n",
                 d, layers, double(nh) / 1e6, ps.hidden.size(), double(nr) / 1e6, world, threads, ns_precision,
                 ns_gram ? " gram" : "", steps);

    AdamWConfig ac;
    MuonConfig mc;
    mc.ns.precision = optim::parse_ns_precision(ns_precision);
    mc.ns.gram = ns_gram;
    mc.ns.gram_min_aspect = 2.f;
    const StepContext ctx{1.f, 1.f};
    if (sections != "zero") {
      std::vector<ParamRef> all = ps.hidden;
      all.insert(all.end(), ps.rest.begin(), ps.rest.end());
      AdamW adamw_all(all, ac), adamw_rest(ps.rest, ac);
      double t_adam = time_steps("adamw (all params)", [&] { adamw_all.step(ctx); }, steps);

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
      if (rank == 0) fmt::print("{:<30} {:9.2f} ms  (mean over each K=4 cycle, median of {} cycles)\n",
                                "prmuon-sharded-k4 + adamw", median(per4), per4.size());

      Dion3Config dc;
      dc.fraction = 0.25f;
      dc.ns = mc.ns;
      parallel::Dion3Dist dion(ps.hidden, dc, parallel::SelectScope::global, comm.get());
      time_steps("dion3-global-a0.25 + adamw", [&] { dion.step(ctx); adamw_rest.step(ctx); }, steps);

      if (rank == 0)
        fmt::print("distributed muon / adamw = {:.2f} (target <= 1.3 on 2 ranks)\n", t_owner / t_adam);
    }

    if (sections != "dist") {
      // The real model under ZeRO: optimizer state and updates sharded over equal flat chunks.
      nn::GPTConfig gc = nn::GPTConfig::preset("gpt2");
      gc.n_embd = d;
      gc.n_layer = layers;
      gc.n_head = gc.n_kv_head = std::max<int64_t>(1, d / 64);
      nn::GPT model(gc);
      model.init_weights(1);
      Tensor g = model.flat_grads();
      Rng(2).fill_normal(g, 0.f, 1e-3f);  // the same on every rank, as averaged gradients are
      parallel::ParallelConfig pc;
      pc.strategy = "zero" + std::to_string(zero_stage);
      if (rank == 0)
        fmt::print("ZeRO-{} over {} rank(s), {} MiB buckets, the model's {:.1f}M parameters\n", zero_stage, world,
                   pc.bucket_mb, double(model.num_params()) / 1e6);
      auto sharded = [&](const std::string& type, int period) {
        parallel::ShardedMuonConfig smc;
        smc.type = type;
        smc.prm.muon = mc;
        smc.prm.period = period;
        smc.adamw = ac;
        return parallel::ShardedOptimizerFactory(
            [smc](nn::Model& m, const parallel::FlatLayout& l, comm::Communicator* grp) {
              return std::unique_ptr<parallel::ShardedOptimizer>(std::make_unique<parallel::ShardedMuon>(m, l, grp, smc));
            });
      };
      double z_adam = 0, z_muon = 0, z_adam_dp = 0, z_muon_dp = 0;
      {
        auto dp = parallel::make_data_parallel(model, comm.get(), pc, ac);
        z_adam = time_steps("zero adamw: optimizer", [&] { dp->optimizer().step(ctx); }, steps);
        z_adam_dp = time_steps("zero adamw: dp.step", [&] { dp->step(ctx); }, steps);
      }
      {
        auto dp = parallel::make_data_parallel(model, comm.get(), pc, ac, nullptr, sharded("muon", 1));
        z_muon = time_steps("zero muon+adamw: optimizer", [&] { dp->optimizer().step(ctx); }, steps);
        z_muon_dp = time_steps("zero muon+adamw: dp.step", [&] { dp->step(ctx); }, steps);
        if (auto* sm = dynamic_cast<parallel::ShardedMuon*>(&dp->optimizer()); sm && rank == 0) {
          auto own = sm->owners();
          fmt::print("  momentum elements on rank 0: {}; owned matrices per rank:", sm->momentum_elems());
          for (int r = 0; r < world; ++r) fmt::print(" {}", std::count(own.begin(), own.end(), r));
          fmt::print("; all_to_all padding {:.1f}%\n", 100 * sm->padding_fraction());
          const auto& tm = sm->timing();
          double n = double(std::max<int64_t>(tm.steps, 1)) / 1e3;
          fmt::print("  rank 0, mean per step: total {:.1f} ms = adamw {:.1f} + 2 all_to_alls {:.1f} + owners' "
                     "Newton-Schulz {:.1f} + elementwise {:.1f}\n",
                     tm.total_s / n, tm.adamw_s / n, tm.exchange_s / n, tm.orthogonalize_s / n,
                     (tm.total_s - tm.adamw_s - tm.exchange_s - tm.orthogonalize_s) / n);
        }
      }
      {
        auto dp = parallel::make_data_parallel(model, comm.get(), pc, ac, nullptr, sharded("prmuon", 4));
        std::vector<double> per4;
        dp->optimizer().step(ctx);  // warm-up (a refresh); the cycles below start on step 2
        for (int c = 0; c < std::max(2, steps / 2); ++c) {
          comm->barrier();
          auto t0 = Clock::now();
          for (int s = 0; s < 4; ++s) dp->optimizer().step(ctx);
          Tensor x = Tensor::full({1}, float(std::chrono::duration<double>(Clock::now() - t0).count() / 4));
          comm->all_reduce(x, comm::ReduceOp::max);
          per4.push_back(double(x.f32()[0]) * 1e3);
        }
        if (rank == 0)
          fmt::print("{:<30} {:9.2f} ms  (mean over each K=4 cycle, median of {} cycles)\n",
                     "zero prmuon-k4: optimizer", median(per4), per4.size());
      }
      if (rank == 0)
        fmt::print("ZeRO muon / ZeRO adamw: optimizer {:.2f}x, dp.step {:.2f}x (target <= 1.3)\n", z_muon / z_adam,
                   z_muon_dp / z_adam_dp);
    }
    comm->barrier();
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_dist_optim: {}\n", e.what());
    return 1;
  }
  return 0;
}
