// One MoE layer's forward + backward under expert parallelism, per dispatcher: all_gather (the
// reference), all_to_all, and all_to_all with the experts tiled and overlapped with the return
// exchange, its tiles sent one message per tile, coalesced into 4 messages per destination (the
// default) or into one. Run as the ranks of a job; rank 0 prints one JSON line per dispatcher
// (median step time over the steps) and each overlap's speedup over all_to_all.
// usage: atoll launch --nproc-per-node 2 -- bench_moe_ep [TOKENS=1024] [DIM=256] [EXPERTS=8] [FFN=512] [STEPS=7]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
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
               {"all_to_all + tile overlap, one message per tile", "all_to_all", true, {64, 0}},
               {"all_to_all + tile overlap, 4 messages per destination", "all_to_all", true, {64, 4}},
               {"all_to_all + tile overlap, 1 message per destination", "all_to_all", true, {64, 1}}};
  std::vector<double> med;
  for (const Case& k : cases) {
    auto d = parallel::make_expert_dispatcher(k.kind, comm.get(), k.overlap, k.grain);
    root.layer->set_dispatcher(d.get());
    std::vector<double> t;
    for (int s = 0; s < steps + 1; ++s) {
      comm->barrier();
      auto t0 = std::chrono::steady_clock::now();
      root.zero_grad();
      Tensor xi = x.clone();
      set_requires_grad(xi, true, "x");
      backward(ops::sum((*root.layer)(xi)));
      comm->barrier();
      if (s > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(t.begin(), t.end());
    med.push_back(t[t.size() / 2]);
    if (comm->rank() == 0)
      std::printf("%s\n", nlohmann::json{{"dispatcher", k.name}, {"ranks", comm->size()}, {"tokens_per_rank", N},
                                         {"dim", C}, {"experts", E}, {"expert_ffn", F}, {"layer_ms", med.back() * 1e3}}
                              .dump()
                              .c_str());
    root.layer->set_dispatcher(nullptr);
  }
  if (comm->rank() == 0)
    std::printf("cpu: %s, %d threads per rank (shared machine: under load); overlap speedup over all_to_all: "
                "per tile %.2fx, 4 messages %.2fx, 1 message %.2fx\n",
                cpu::cpu_features().model.c_str(), num_threads(), med[1] / med[2], med[1] / med[3], med[1] / med[4]);
  return 0;
}
