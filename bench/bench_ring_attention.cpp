// Ring attention (parallel/context_parallel.h) on the ranks of `atoll launch`: forward and
// backward of one attention layer over a row split across the ranks, against the same layer on
// one rank over the whole row (the same block kernel, and ops::attention's causal kernel); and the share of the ring's communication hidden behind compute:
// 1 − (time spent waiting on transfers during the ring) / (time the same transfers take alone).
// Prints one JSON line on rank 0.
// usage: atoll launch --nproc-per-node 2 -- bench_ring_attention B T H HD ITERS [THREADS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autograd/ops.h"
#include "comm/communicator.h"
#include "core/threads.h"
#include "parallel/context_parallel.h"
#include "tensor/rng.h"

using namespace atl;
using Clock = std::chrono::steady_clock;

namespace {
double secs(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "?";
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s B T H HD ITERS [THREADS]\n", argv[0]);
    return 1;
  }
  const int64_t B = std::atoll(argv[1]), T = std::atoll(argv[2]), H = std::atoll(argv[3]), hd = std::atoll(argv[4]);
  const int iters = std::atoi(argv[5]);
  set_num_threads(argc >= 7 ? std::atoi(argv[6]) : 1);
  auto comm = comm::make_communicator("auto");
  const int cp = comm->size(), rank = comm->rank();
  const int64_t S = 3 * H * hd, Tl = T / cp;
  Tensor full = Tensor::empty({B, T, S}), dout = Tensor::empty({B, T, H * hd});
  Rng(1, 0).fill_normal(full, 0.f, 1.f);
  Rng(2, 0).fill_normal(dout, 0.f, 1.f);
  const auto spans = parallel::context_spans(T, cp, rank, true);
  Tensor local = nn::take_spans(full, spans), dlocal = nn::take_spans(dout, spans);

  auto run_ring = [&] {
    Tensor q = local.contiguous();
    set_requires_grad(q);
    Tensor o = parallel::ring_attention(comm.get(), q, H, H, hd, T, true, Tensor());
    backward(ops::dot_const(o, dlocal));
  };
  std::vector<double> ring_s, one_ops_s, one_s, comm_alone_s, wait_s;
  for (int i = 0; i < iters + 1; ++i) {
    comm->barrier();
    parallel::ring_times() = {};
    auto t0 = Clock::now();
    run_ring();
    const double dt = secs(t0);
    if (i > 0) ring_s.push_back(dt), wait_s.push_back(parallel::ring_times().wait_s);
    // The same transfers alone: forward cp−1 K/V passes, backward cp−1 K/V and cp dK/dV passes.
    comm->barrier();
    Tensor kv = Tensor::empty({B, Tl, 2 * H * hd}), in = Tensor::empty({B, Tl, 2 * H * hd});
    t0 = Clock::now();
    for (int p = 0; cp > 1 && p < 3 * (cp - 1) + 1; ++p) {
      auto s = comm->send_async(kv, (rank + 1) % cp, 100 + p);
      auto r = comm->recv_async(in, (rank + cp - 1) % cp, 100 + p);
      s->wait();
      r->wait();
    }
    if (i > 0) comm_alone_s.push_back(secs(t0));
    // One rank over the whole row (the reference layer); every rank runs it at once, so that
    // the machine is as busy as during the ring.
    comm->barrier();
    for (int k = 0; k < 2; ++k) {  // the ring's block kernel on the whole row, then ops::attention's causal kernel
      Tensor q = full.contiguous();
      set_requires_grad(q);
      t0 = Clock::now();
      Tensor o = k == 0 ? parallel::ring_attention(nullptr, q, H, H, hd, T, true, Tensor())
                        : ops::attention(q, H, H, hd, true, Tensor());
      backward(ops::dot_const(o, dout));
      if (i > 0) (k == 0 ? one_s : one_ops_s).push_back(secs(t0));
    }
  }
  if (rank == 0) {
    const double ring = median(ring_s), wait = median(wait_s), alone = median(comm_alone_s), one = median(one_s),
                 one_ops = median(one_ops_s);
    nlohmann::json j = {{"cpu", cpu_model()}, {"cp", cp}, {"B", B}, {"T", T}, {"H", H}, {"hd", hd},
                        {"ring_fwd_bwd_s", ring}, {"one_rank_fwd_bwd_s", one}, {"speedup_vs_one_rank", one / ring},
                        {"one_rank_ops_attention_s", one_ops},
                        {"comm_wait_s", wait}, {"comm_alone_s", alone},
                        {"comm_hidden_share", cp > 1 ? nlohmann::json(std::clamp(1.0 - wait / alone, 0.0, 1.0)) : nlohmann::json()}};
    std::printf("%s\n", j.dump().c_str());
  }
  comm->barrier();
  return 0;
}
