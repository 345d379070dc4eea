// Rollout-worker recovery (rl/belayer.h): the time from a worker's death to the first newly
// sampled token, for the pre-started shadow (weights already in memory: reads the journal,
// rebuilds the unfinished request's KV cache from its prefix, continues) against a cold start
// (builds the model, loads the weights from a safetensors file, then the same). The death is
// simulated by cutting the finished journal after a given line. Cold start here excludes process
// start-up and joining a communicator, so the ratio is a lower bound. Prints one JSON line.
//
// usage: bench_belayer [N_LAYER N_EMBD REQUESTS MAX_NEW CUT_LINE REPS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/threads.h"
#include "models/gpt/gpt.h"
#include "rl/belayer.h"
#include "rl/verifiable_task.h"
#include "tensor/safetensors.h"

using namespace atl;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  try {
    const int L = argc > 1 ? std::atoi(argv[1]) : 4, C = argc > 2 ? std::atoi(argv[2]) : 256;
    const int R = argc > 3 ? std::atoi(argv[3]) : 16, max_new = argc > 4 ? std::atoi(argv[4]) : 16;
    const int cut = argc > 5 ? std::atoi(argv[5]) : 60, reps = argc > 6 ? std::atoi(argv[6]) : 5;
    set_num_threads(1);
    nn::GPTConfig c = nn::GPTConfig::preset("gpt2");
    c.n_layer = L;
    c.n_embd = C;
    c.n_head = c.n_kv_head = 4;
    c.vocab_size = 128;
    c.block_size = 64;
    nn::GPT model(c);
    model.init_weights(1);
    const auto dir = std::filesystem::temp_directory_path() / ("atoll_bench_belayer_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    const std::string weights = (dir / "weights.safetensors").string(), full = (dir / "full").string(),
                      cutj = (dir / "cut").string();
    save_safetensors(weights, model.state_dict(), model.config_metadata());
    std::vector<rl::RolloutRequest> reqs;
    for (int i = 0; i < R; ++i) reqs.push_back({i, rl::encode(std::to_string(10 + i) + "+" + std::to_string(3 * i) + "=")});
    nn::SamplingConfig s;
    s.temperature = 1.0f;
    s.seed = 9;  // no stop token: every request runs max_new tokens, the cut lands mid-trajectory
    rl::RolloutWorker shadow(model, s, max_new);
    shadow.run(reqs, full);
    std::vector<std::string> lines;
    {
      std::ifstream f(full);
      for (std::string l; std::getline(f, l);) lines.push_back(l);
    }
    auto make_cut = [&] {
      std::ofstream f(cutj, std::ios::trunc);
      for (int i = 0; i < cut && i < int(lines.size()); ++i) f << lines[size_t(i)] << "\n";
    };
    std::vector<double> warm, cold;
    for (int r = 0; r < reps; ++r) {
      make_cut();
      auto t0 = Clock::now();
      rl::WorkerStats st = shadow.run(reqs, cutj);
      warm.push_back(std::chrono::duration<double>(Clock::now() - t0).count() - st.seconds + st.first_token_s);
      make_cut();
      t0 = Clock::now();
      TensorFile tf = load_safetensors(weights);
      auto m = nn::model_from_metadata(tf.metadata);
      m->load_state_dict(tf.tensors, weights);
      rl::RolloutWorker fresh(*m, s, max_new);
      const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
      rl::WorkerStats st2 = fresh.run(reqs, cutj);
      cold.push_back(load_s + st2.first_token_s);
    }
    std::sort(warm.begin(), warm.end());
    std::sort(cold.begin(), cold.end());
    const double w = warm[warm.size() / 2], k = cold[cold.size() / 2];
    std::printf("%s\n", nlohmann::json({{"params", model.num_params()}, {"requests", R}, {"cut_line", cut},
                                        {"shadow_ms", 1e3 * w}, {"cold_ms", 1e3 * k}, {"cold_over_shadow", k / w}})
                            .dump()
                            .c_str());
    std::filesystem::remove_all(dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_belayer: %s\n", e.what());
    return 1;
  }
}
