// Cached generation (KV cache, models/gpt/generate.h) against full recomputation of the context for every
// token, on one model: both paths generate the same number of new tokens from the same prompt, a
// few times each, alternating; prints each time, the medians, the speed-up and whether the tokens
// agree, then one JSON line. Two recomputations: nn::generate's reference path (the head only at
// the last position, the same context window as the cache) and GPT::generate, which `atoll sample`
// used before the cache (the head at every position, a sliding window past block_size, so its
// tokens may differ once the context is full). The target is a speed-up of at least 5x at
// 256 new tokens.
//
// usage: bench_generate MODEL [NEW_TOKENS=256] [RUNS=3] [THREADS=0] [PROMPT_TOKENS=16]
//   MODEL: a config file (its [model] section, e.g. configs/default.toml) or a preset (d384, gpt2, ...)
// Random weights (seeded): speed does not depend on their values. Greedy decoding, so that "same
// tokens" compares a deterministic choice.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/threads.h"
#include "models/gpt/generate.h"

using namespace atl;

namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

double loadavg() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  f >> l;
  return l;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [NEW_TOKENS=256] [RUNS=3] [THREADS=0] [PROMPT_TOKENS=16]\n", argv[0]);
    return 1;
  }
  const std::string model_arg = argv[1];
  const int64_t new_tokens = argc > 2 ? std::atoll(argv[2]) : 256;
  const int runs = argc > 3 ? std::atoi(argv[3]) : 3;
  const int threads = argc > 4 ? std::atoi(argv[4]) : 0;
  const int64_t prompt_len = argc > 5 ? std::atoll(argv[5]) : 16;
  nn::GPTConfig cfg;
  if (std::filesystem::is_regular_file(model_arg)) {
    Config c = Config::load(model_arg);
    cfg = nn::GPTConfig::from_config(c);
  } else {
    cfg = nn::GPTConfig::preset(model_arg);
  }
  set_num_threads(threads);
  nn::GPT model(cfg);
  model.init_weights(1);
  Rng r(11, 0);
  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < prompt_len; ++i) prompt.push_back(int32_t(r.below(uint64_t(cfg.vocab_size))));

  nn::GenerateOptions o;
  o.max_new_tokens = new_tokens;
  o.sampling.temperature = 0;
  auto timed = [&](bool cache, std::vector<int32_t>* toks) {
    o.use_cache = cache;
    auto t0 = std::chrono::steady_clock::now();
    auto g = nn::generate(model, {prompt}, o);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    *toks = g[0].tokens;
    return s;
  };
  std::printf("model: %s (%s, %.2fM parameters)\n", cfg.describe().c_str(), model_arg.c_str(),
              double(model.num_params()) / 1e6);
  std::printf("cpu: %s, %d threads, load average %.1f at start (the machine is shared)\n", cpu_model().c_str(),
              num_threads(), loadavg());
  std::printf("generating %lld new tokens after a %lld-token prompt, greedy; %d runs each, alternating\n",
              (long long)new_tokens, (long long)prompt_len, runs);
  std::vector<int32_t> ref, got;
  timed(true, &got);  // warm-up: the allocator's cache, the BLAS's buffers
  auto timed_old = [&](std::vector<int32_t>* toks) {
    Rng unused(0, 0);  // greedy: GPT::generate at temperature ~0 picks the argmax
    auto t0 = std::chrono::steady_clock::now();
    auto seq = model.generate(prompt, new_tokens, 0.0f, 0, unused);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    toks->assign(seq.begin() + prompt_len, seq.end());
    return s;
  };
  std::vector<double> tc, tr, to;
  std::vector<int32_t> old_toks;
  bool same = true, same_old = true;
  for (int i = 0; i < runs; ++i) {
    tc.push_back(timed(true, &got));
    tr.push_back(timed(false, &ref));
    to.push_back(timed_old(&old_toks));
    same = same && got == ref;
    same_old = same_old && got == old_toks;
    std::printf("  run %d: cached %.3f s, recompute %.3f s, previous sample path %.3f s\n", i + 1, tc.back(),
                tr.back(), to.back());
  }
  const double mc = median(tc), mr = median(tr), mo = median(to);
  std::printf("median: cached %.3f s (%.1f tok/s); recompute %.3f s (%.1f tok/s), speed-up %.1fx, tokens %s; "
              "previous sample path %.3f s, speed-up %.1fx, tokens %s\n",
              mc, double(new_tokens) / mc, mr, double(new_tokens) / mr, mr / mc, same ? "identical" : "DIFFERENT", mo,
              mo / mc, same_old ? "identical" : "different (its sliding window)");
  nlohmann::json j = {{"bench", "generate"},     {"model", model_arg},       {"new_tokens", new_tokens},
                      {"prompt_tokens", prompt_len}, {"runs", runs},         {"threads", num_threads()},
                      {"cached_s", mc},          {"recompute_s", mr},        {"speedup", mr / mc},
                      {"previous_s", mo},        {"speedup_previous", mo / mc}, {"same_tokens_previous", same_old},
                      {"same_tokens", same},     {"cpu", cpu_model()},       {"loadavg_end", loadavg()}};
  std::printf("%s\n", j.dump().c_str());
  return same ? 0 : 1;
}
