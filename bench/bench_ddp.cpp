// Data-parallel step benchmark, one rank of a job started by `atoll launch` (or alone): the GPT
// training step under a strategy (ddp, zero1/2/3, hsdp) on synthetic tokens, reporting the median
// step time, the job's tokens/s, for DDP the share of gradient communication hidden behind
// backward (1 - time the last rank to finish backward waited for its reductions / time the same
// all-reduces take alone; as a mean over the steps and for the median step), and each
// rank's peak resident memory during training and its resident memory before the model existed
// (the largest over the ranks). Rank 0 prints one JSON line.
//
// usage: bench_ddp STRATEGY N_LAYER N_EMBD N_HEAD B T STEPS [BUCKET_MB] [THREADS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autograd/graph.h"
#include "core/threads.h"
#include "optim/clip.h"
#include "models/gpt/gpt.h"
#include "parallel/data_parallel.h"
#include "parallel/ddp.h"
#include "parallel/page_release.h"
#include "tensor/rng.h"

using namespace atl;

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: bench_ddp STRATEGY N_LAYER N_EMBD N_HEAD B T STEPS [BUCKET_MB] [THREADS]\n");
    return 2;
  }
  try {
    std::string strategy = argv[1];
    int L = std::atoi(argv[2]), C = std::atoi(argv[3]), H = std::atoi(argv[4]);
    int64_t B = std::atoll(argv[5]), T = std::atoll(argv[6]);
    int steps = std::atoi(argv[7]);
    double bucket_mb = argc > 8 ? std::atof(argv[8]) : 25.0;
    int threads = argc > 9 ? std::atoi(argv[9]) : 1;
    set_num_threads(threads);
    auto env = comm::DistEnv::from_environment();
    std::unique_ptr<comm::Communicator> comm;
    if (env.world_size > 1) comm = comm::make_communicator("auto");
    int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;

    const int64_t base_rss = parallel::resident_bytes();  // the process before the model exists
    nn::GPTConfig c = nn::GPTConfig::preset("gpt2");
    c.n_layer = L;
    c.n_embd = C;
    c.n_head = c.n_kv_head = H;
    c.vocab_size = 257;
    c.block_size = T;
    nn::GPT model(c);
    model.init_weights(1);
    parallel::ParallelConfig pc;
    pc.strategy = strategy;
    pc.bucket_mb = bucket_mb;
    pc.hsdp_shard_size = strategy == "hsdp" ? std::max(1, world / 2) : 0;
    auto dp = parallel::make_data_parallel(model, comm.get(), pc, AdamWConfig{});
    Rng rng(100 + uint64_t(rank), 0);
    Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
    for (int64_t i = 0; i < B * T; ++i) {
      x.i32()[i] = int32_t(rng.next_u64() % 257);
      y.i32()[i] = int32_t(rng.next_u64() % 257);
    }
    std::vector<double> times, step_waits;
    double wait0 = 0;
    auto* ddp = dynamic_cast<parallel::DDP*>(dp.get());
    for (int s = 0; s <= steps; ++s) {
      if (s == 1) {
        // Peak memory of the training steps, not of building the model.
        std::ofstream("/proc/self/clear_refs") << "5";
        if (auto* d = dynamic_cast<parallel::DDP*>(dp.get())) wait0 = d->timing().wait_s;
      }
      auto t0 = std::chrono::steady_clock::now();
      dp->zero_grad();
      Tensor loss = model.loss(x, y);
      backward(loss);
      double waited_before = ddp ? ddp->timing().wait_s : 0;
      dp->finish_backward();
      if (s > 0 && ddp) step_waits.push_back(ddp->timing().wait_s - waited_before);
      dp->step({1.f, clip_coefficient(dp->grad_norm(), 1.f)});
      if (s > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    double med = times[times.size() / 2];
    nlohmann::json out = {{"impl", "atoll"}, {"strategy", dp->name()}, {"world", world}, {"step_s", med},
                          {"tokens_per_s", double(B * T * world) / med}, {"params", model.num_params()}};
    // The largest peak over the ranks (before the scratch buffer of time_reductions).
    Tensor peak = Tensor::empty({1}, DType::i64);
    *peak.data<int64_t>() = parallel::peak_resident_bytes();
    if (comm) comm->all_reduce(peak, comm::ReduceOp::max);
    out["peak_rss_bytes"] = *peak.data<int64_t>();
    *peak.data<int64_t>() = base_rss;
    if (comm) comm->all_reduce(peak, comm::ReduceOp::max);
    out["base_rss_bytes"] = *peak.data<int64_t>();
    if (auto* d = dynamic_cast<parallel::DDP*>(dp.get()); d && world > 1) {
      // The rank that finishes backward last waits only for communication; the others also wait
      // for it (load imbalance, large on a shared machine), so the smallest wait is the exposed share.
      Tensor w = Tensor::empty({1});
      w.f32()[0] = -float((d->timing().wait_s - wait0) / double(steps));
      comm->all_reduce(w, comm::ReduceOp::max);
      double wait = -double(w.f32()[0]);
      // The same per step, then the median step: on a shared machine one step in which a rank
      // lost its core moves the mean far more than it says about the overlap.
      Tensor sw = Tensor::empty({int64_t(step_waits.size())});
      for (size_t k = 0; k < step_waits.size(); ++k) sw.f32()[k] = -float(step_waits[k]);
      comm->all_reduce(sw, comm::ReduceOp::max);
      std::vector<double> exposed(step_waits.size());
      for (size_t k = 0; k < exposed.size(); ++k) exposed[k] = -double(sw.f32()[k]);
      std::sort(exposed.begin(), exposed.end());
      double alone = 0;
      std::vector<double> alones;
      for (int r = 0; r < 3; ++r) {
        alones.push_back(d->time_reductions());
        alone += alones.back() / 3;
      }
      std::sort(alones.begin(), alones.end());
      out["comm_wait_s"] = wait;
      out["comm_alone_s"] = alone;
      out["hidden_share"] = alone > 0 ? std::max(0.0, 1.0 - wait / alone) : 0.0;
      out["comm_wait_median_s"] = exposed[exposed.size() / 2];
      out["hidden_share_median"] = std::max(0.0, 1.0 - exposed[exposed.size() / 2] / alones[1]);
      out["buckets"] = d->num_buckets();
    }
    if (rank == 0) std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ddp: %s\n", e.what());
    return 1;
  }
}
