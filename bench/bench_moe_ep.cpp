// One MoE layer's forward + backward under expert parallelism, per dispatcher: all_gather (the
// reference), all_to_all, and all_to_all with the experts tiled and overlapped with the
// exchanges: the forward's return only (parallel.ep_overlap_backward = false), or the backward's
// two exchanges as well (the default), with the tiles coalesced into 4 messages per destination
// (the default), one, or sent one per tile. The cases run in rotation, one step each per round,
// so that a loaded machine's swings fall on all of them alike; rank 0 prints one JSON line per
// dispatcher (median step time) and each overlap's speedup over all_to_all as the median of the
// per-round ratios.
// usage: atoll launch --nproc-per-node 2 -- bench_moe_ep [TOKENS=1024] [DIM=256] [EXPERTS=8] [FFN=512] [ROUNDS=7]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/ops.h"
#include "comm/communicator.h"
#include "core/threads.h"
#include "kernels/cpu/isa.h"
#include "nn/moe.h"
#include "parallel/expert_parallel.h"
#include "tensor/rng.h"

using namespace atl;

namespace {
struct Root : nn::Module {
  explicit Root(const nn::MoEConfig& c) : Module("") {
    layer = child<nn::MoELayer>("mlp", c);
    materialize();
  }
  nn::MoELayer* layer;
};
}  // namespace

int main(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoll(argv[1]) : 1024, C = argc > 2 ? std::atoll(argv[2]) : 256;
  const int64_t E = argc > 3 ? std::atoll(argv[3]) : 8, F = argc > 4 ? std::atoll(argv[4]) : 512;
  const int steps = argc > 5 ? std::atoi(argv[5]) : 7;
  auto comm = comm::make_communicator("auto");
  set_num_threads(0);
  nn::MoEConfig c;
  c.dim = C, c.n_experts = E, c.top_k = 2, c.expert_ffn = F;
  Root root(c);
  Tensor fv = root.flat_values();
  Rng(1, 0).fill_normal(fv, 0.f, 0.05f);
  Tensor x = Tensor::empty({N, C});
  Rng(2 + uint64_t(comm->rank()), 0).fill_normal(x, 0.f, 1.f);
  struct Case {
    const char* name;
    std::string kind;
    bool overlap;
    parallel::OverlapGrain grain;
  } cases[] = {{"all_gather", "all_gather", false, {}},
               {"all_to_all", "all_to_all", false, {}},
               {"overlap forward only, 4 messages per destination", "all_to_all", true, {64, 4, false}},
               {"overlap forward + backward, 4 messages per destination", "all_to_all", true, {64, 4, true}},
               {"overlap forward + backward, 1 message per destination", "all_to_all", true, {64, 1, true}},
               {"overlap forward + backward, one message per tile", "all_to_all", true, {64, 0, true}}};
  const size_t K = sizeof(cases) / sizeof(cases[0]);
  std::vector<std::unique_ptr<nn::ExpertDispatcher>> ds;
  for (const Case& k : cases) ds.push_back(parallel::make_expert_dispatcher(k.kind, comm.get(), k.overlap, k.grain));
  std::vector<std::vector<double>> t(K);
  for (int s = 0; s < steps + 1; ++s) {
    for (size_t i = 0; i < K; ++i) {
      root.layer->set_dispatcher(ds[i].get());
      comm->barrier();
      auto t0 = std::chrono::steady_clock::now();
      root.zero_grad();
      Tensor xi = x.clone();
      set_requires_grad(xi, true, "x");
      backward(ops::sum((*root.layer)(xi)));
      comm->barrier();
      if (s > 0) t[i].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  root.layer->set_dispatcher(nullptr);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::string ratios;
  for (size_t i = 0; i < K && comm->rank() == 0; ++i) {
    std::vector<double> r;
    for (size_t s = 0; s < t[i].size(); ++s) r.push_back(t[1][s] / t[i][s]);  // paired with all_to_all's round
    std::printf("%s\n", nlohmann::json{{"dispatcher", cases[i].name}, {"ranks", comm->size()}, {"tokens_per_rank", N},
                                       {"dim", C}, {"experts", E}, {"expert_ffn", F}, {"layer_ms", median(t[i]) * 1e3},
                                       {"speedup_over_all_to_all", median(r)}}
                            .dump()
                            .c_str());
    if (i >= 2) ratios += fmt::format("{}{}: {:.2f}x", ratios.empty() ? "" : ", ", cases[i].name, median(r));
  }
  if (comm->rank() == 0)
    std::printf("cpu: %s, %d threads per rank (shared machine: under load); median of per-round speedups over "
                "all_to_all: %s\n", cpu::cpu_features().model.c_str(), num_threads(), ratios.c_str());
  return 0;
}
