// Tensor-parallel step benchmark, one rank of a job started by `atoll launch` (or alone): the GPT
// training step (forward, backward, AdamW) with the model split over all ranks (tp = world;
// parallel/tensor_parallel.h), on synthetic tokens. Reports the median step time and, for tp > 1,
// the tp communication: the time the compute thread spent blocked in the collectives' wait()
// per step (median step; the smallest over the ranks, since a rank that arrives late makes the
// other wait for it, not for the network), the time the same collectives take run alone, one
// after another (median of 3 replays), and the hidden share 1 - wait / alone. Rank 0 prints one
// JSON line.
//
// usage: bench_tp N_LAYER N_EMBD N_HEAD B T STEPS [SP=1] [THREADS=1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "autograd/graph.h"
#include "core/threads.h"
#include "models/gpt/gpt.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "parallel/mesh.h"
#include "parallel/tensor_parallel.h"
#include "tensor/rng.h"

using namespace atl;

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: bench_tp N_LAYER N_EMBD N_HEAD B T STEPS [SP=1] [THREADS=1]\n");
    return 2;
  }
  try {
    int L = std::atoi(argv[1]), C = std::atoi(argv[2]), H = std::atoi(argv[3]);
    int64_t B = std::atoll(argv[4]), T = std::atoll(argv[5]);
    int steps = std::atoi(argv[6]);
    bool sp = argc > 7 ? std::atoi(argv[7]) != 0 : true;
    set_num_threads(argc > 8 ? std::atoi(argv[8]) : 1);
    auto env = comm::DistEnv::from_environment();
    std::unique_ptr<comm::Communicator> comm;
    if (env.world_size > 1) comm = comm::make_communicator("auto");
    int rank = comm ? comm->rank() : 0, world = comm ? comm->size() : 1;
    nn::GPTConfig c = nn::GPTConfig::preset("gpt2");
    c.n_layer = L;
    c.n_embd = C;
    c.n_head = c.n_kv_head = H;
    c.vocab_size = 4096;
    c.block_size = T;
    std::unique_ptr<nn::Model> model = std::make_unique<nn::GPT>(c);
    parallel::MeshShape shape;
    shape.tp = world;
    parallel::Mesh mesh(comm.get(), shape);
    std::unique_ptr<parallel::TensorParallel> tp;
    if (world > 1) tp = parallel::TensorParallel::apply(model, mesh, sp);
    model->init_weights(1);
    AdamW opt(model->param_refs(), AdamWConfig{});
    Rng rng(100, 0);  // every rank of the tp group reads the same batch
    Tensor x = Tensor::empty({B, T}, DType::i32), y = Tensor::empty({B, T}, DType::i32);
    for (int64_t i = 0; i < B * T; ++i) {
      x.i32()[i] = int32_t(rng.next_u64() % uint64_t(c.vocab_size));
      y.i32()[i] = int32_t(rng.next_u64() % uint64_t(c.vocab_size));
    }
    std::vector<double> times, waits, waits_ov;
    for (int s = 0; s <= steps; ++s) {  // step 0 warms up
      double w0 = tp ? tp->stats().wait_s : 0, wo0 = tp ? tp->stats().wait_overlapped_s : 0;
      auto t0 = std::chrono::steady_clock::now();
      model->zero_grad();
      Tensor loss = model->loss(x, y);
      backward(loss);
      if (tp) tp->finish_backward();
      double norm = tp ? tp->grad_norm() : grad_norm(model->flat_grads());
      opt.step({1.f, clip_coefficient(norm, 1.f)});
      if (s > 0) {
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        waits.push_back((tp ? tp->stats().wait_s : 0) - w0);
        waits_ov.push_back((tp ? tp->stats().wait_overlapped_s : 0) - wo0);
      }
    }
    std::sort(times.begin(), times.end());
    double med = times[times.size() / 2];
    nlohmann::json out = {{"impl", "atoll"}, {"tp", world}, {"sequence_parallel", sp && world > 1},
                          {"step_s", med}, {"tokens_per_s", double(B * T) / med}};
    if (tp) {
      // The smallest wait over the ranks is the exposed communication (see the header); the
      // median step of it.
      // sign -1: the smaller rank's wait per step, +1: the larger's; then the median step.
      auto exposed = [&](const std::vector<double>& ws, float sign) {
        Tensor w = Tensor::empty({int64_t(ws.size())});
        for (size_t k = 0; k < ws.size(); ++k) w.f32()[k] = sign * float(ws[k]);
        comm->all_reduce(w, comm::ReduceOp::max);
        std::vector<double> e(ws.size());
        for (size_t k = 0; k < ws.size(); ++k) e[k] = double(sign * w.f32()[k]);
        std::sort(e.begin(), e.end());
        return e[e.size() / 2];
      };
      double wait = exposed(waits, -1), wait_ov = exposed(waits_ov, -1);
      // The rank that waits most also waits for the other to arrive (skew, on a loaded machine).
      out["comm_wait_max_rank_s"] = exposed(waits, 1);
      std::vector<parallel::TpCollectiveTimes> alone;
      for (int r = 0; r < 3; ++r) alone.push_back(tp->time_collectives());
      std::sort(alone.begin(), alone.end(), [](auto& a, auto& b) { return a.all_s < b.all_s; });
      Tensor a = Tensor::from_vector({float(alone[1].all_s), float(alone[1].overlappable_s)}, {2});
      comm->all_reduce(a, comm::ReduceOp::max);
      double al = double(a.f32()[0]), al_ov = double(a.f32()[1]);
      out["comm_wait_s"] = wait;
      out["comm_alone_s"] = al;
      out["hidden_share"] = al > 0 ? std::max(0.0, 1.0 - wait / al) : 0.0;
      // Only the collectives that have compute beside them (gathers before the GEMMs, backward
      // reductions beside dW): how much of those the overlap hides.
      out["overlappable_wait_s"] = wait_ov;
      out["overlappable_alone_s"] = al_ov;
      out["overlappable_hidden_share"] = al_ov > 0 ? std::max(0.0, 1.0 - wait_ov / al_ov) : 0.0;
      out["collectives_per_step"] = tp->stats().collectives / (steps + 1);
    }
    if (rank == 0) std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tp: %s\n", e.what());
    return 1;
  }
}
