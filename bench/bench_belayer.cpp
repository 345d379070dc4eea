// Rollout-worker recovery (rl/belayer.h): the time from a worker's death to the first newly
// sampled token, for the pre-started shadow (weights already in memory: reads the journal,
// rebuilds the unfinished request's KV cache from its prefix, continues) against a cold start
// (builds the model, loads the weights from a safetensors file, then the same). The death is
// simulated by cutting the finished journal after a given line. Cold start here excludes process
// start-up and joining a communicator, so the ratio is a lower bound. Prints one JSON line.
//
// Three recoveries, timed pair by pair in each repetition (A/B/C interleaved, medians):
//   cold       build the model, load the weights, read the journal, replay the prefix, continue;
//   shadow     weights in memory; read the journal, replay the prefix, continue (sessions 5-6);
//   follower   weights in memory and a JournalFollower that replayed the journal as it grew, LAG
//              lines behind at the death (the lines logged since its last poll): only those are
//              replayed after the death (rl/belayer.h).
// The shadow's own time split (journal read, prompt prefill, prefix replay) is printed too: the
// replay of the prefix, one token per forward, is what a follower moves before the death.
//
// usage: bench_belayer [N_LAYER N_EMBD REQUESTS MAX_NEW CUT_LINE REPS LAG]
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
    const int lag = argc > 7 ? std::atoi(argv[7]) : 2;
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
    auto make_cut = [&](int n) {
      std::ofstream f(cutj, std::ios::trunc);
      for (int i = 0; i < n && i < int(lines.size()); ++i) f << lines[size_t(i)] << "\n";
    };
    // The timed recoveries run the batch up to the cut request only (every request logs max_new
    // tokens and its end, no stop token): the rest would be the same work in all three.
    const std::vector<rl::RolloutRequest> head(reqs.begin(), reqs.begin() + std::min<std::ptrdiff_t>(R, cut / (max_new + 1) + 1));
    std::vector<double> warm, cold, followed, journal_ms, prefill_ms, replay_ms;
    for (int r = 0; r < reps; ++r) {
      // The follower polled while the worker lived, last when LAG lines were still to come.
      make_cut(cut - lag);
      rl::JournalFollower follower(shadow, head, cutj);
      follower.poll();
      make_cut(cut);
      auto tfo = Clock::now();
      rl::WorkerStats sf = shadow.run(head, cutj, 0, &follower);
      followed.push_back(std::chrono::duration<double>(Clock::now() - tfo).count() - sf.seconds + sf.first_token_s);
      make_cut(cut);
      auto t0 = Clock::now();
      rl::WorkerStats st = shadow.run(head, cutj);
      warm.push_back(std::chrono::duration<double>(Clock::now() - t0).count() - st.seconds + st.first_token_s);
      journal_ms.push_back(1e3 * st.journal_s);
      prefill_ms.push_back(1e3 * st.prefill_s);
      replay_ms.push_back(1e3 * st.replay_s);
      make_cut(cut);
      t0 = Clock::now();
      TensorFile tf = load_safetensors(weights);
      auto m = nn::model_from_metadata(tf.metadata);
      m->load_state_dict(tf.tensors, weights);
      rl::RolloutWorker fresh(*m, s, max_new);
      const double load_s = std::chrono::duration<double>(Clock::now() - t0).count();
      rl::WorkerStats st2 = fresh.run(head, cutj);
      cold.push_back(load_s + st2.first_token_s);
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const double w = median(warm), k = median(cold), fo = median(followed);
    std::printf("%s\n", nlohmann::json({{"params", model.num_params()}, {"requests", R}, {"cut_line", cut},
                                        {"lag_lines", lag}, {"shadow_ms", 1e3 * w}, {"follower_ms", 1e3 * fo},
                                        {"cold_ms", 1e3 * k}, {"cold_over_shadow", k / w},
                                        {"cold_over_follower", k / fo},
                                        {"shadow_split_ms", {{"journal", median(journal_ms)},
                                                             {"prefill", median(prefill_ms)},
                                                             {"replay", median(replay_ms)}}}})
                            .dump()
                            .c_str());
    std::filesystem::remove_all(dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_belayer: %s\n", e.what());
    return 1;
  }
}
