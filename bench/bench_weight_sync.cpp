// Weight-sync benchmark, one rank of a 2-rank job started by `atoll launch`: rank 0 pushes a
// GPT's weights to the others with rl::WeightSync (flat buckets, one broadcast each) for several
// model sizes; rank 0 prints one JSON line per size with the median of REPS pushes.
//
// usage: bench_weight_sync [BUCKET_MB] [REPS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "core/threads.h"
#include "models/gpt/gpt.h"
#include "rl/weight_sync.h"

using namespace atl;

int main(int argc, char** argv) {
  try {
    const double bucket_mb = argc > 1 ? std::atof(argv[1]) : 4.0;
    const int reps = argc > 2 ? std::atoi(argv[2]) : 7;
    set_num_threads(1);
    auto comm = comm::make_communicator("auto");
    struct Size {
      int L, C;
    };
    for (Size s : {Size{2, 128}, Size{4, 256}, Size{8, 320}, Size{8, 512}}) {
      nn::GPTConfig c = nn::GPTConfig::preset("gpt2");
      c.n_layer = s.L;
      c.n_embd = s.C;
      c.n_head = c.n_kv_head = 4;
      c.vocab_size = 128;
      c.block_size = 64;
      nn::GPT model(c);
      model.init_weights(1);
      std::vector<Tensor> ts;
      for (nn::Parameter* p : model.parameters()) ts.push_back(p->value);
      rl::WeightSync ws(ts, bucket_mb);
      std::vector<double> sec;
      rl::SyncStats st;
      for (int r = 0; r < reps + 1; ++r) {
        comm->barrier();
        st = ws.broadcast(*comm, 0);
        if (r > 0) sec.push_back(st.seconds);  // the first warms the connections and allocator
      }
      std::sort(sec.begin(), sec.end());
      // The slowest rank's view: the push is done when the last receiver has it.
      Tensor t = Tensor::from_vector({float(sec[sec.size() / 2])}, {1});
      comm->all_reduce(t, comm::ReduceOp::max);
      if (comm->rank() == 0)
        std::printf("%s\n", nlohmann::json({{"params", model.num_params()},
                                            {"tensors", ts.size()},
                                            {"buckets", ws.buckets()},
                                            {"bytes", st.bytes},
                                            {"median_ms", 1e3 * t.f32()[0]},
                                            {"backend", comm->backend()}})
                                .dump()
                                .c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_weight_sync: %s\n", e.what());
    return 1;
  }
}
