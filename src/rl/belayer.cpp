#include "rl/belayer.h"

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "autograd/graph.h"
#include "core/error.h"
#include "nn/policy_model.h"

namespace atl::rl {

JournalState JournalState::read(const std::string& path) {
  JournalState j;
  std::ifstream f(path);
  if (!f) return j;  // no journal yet: nothing was done
  std::string line;
  while (std::getline(f, line)) {
    // A line is complete only with its terminator ';' (a kill can cut the last one).
    if (line.empty() || line.back() != ';') {
      ++j.torn_lines;
      continue;
    }
    std::istringstream in(line.substr(0, line.size() - 1));
    char kind = 0;
    int64_t id = 0, v = 0;
    in >> kind >> id >> v;
    ATOLL_CHECK(in && (kind == 'T' || kind == 'D'), "rollout journal {}: bad line '{}'", path, line);
    Entry& e = j.requests[id];
    ATOLL_CHECK(!e.done, "rollout journal {}: request {} has a line after it finished", path, id);
    if (kind == 'T') e.tokens.push_back(int32_t(v));
    else e.done = true, e.stopped = v != 0;
  }
  return j;
}

RolloutWorker::RolloutWorker(const nn::Model& model, nn::SamplingConfig s, int64_t max_new_tokens)
    : m_(model), s_(std::move(s)), max_new_(max_new_tokens) {
  ATOLL_CHECK(dynamic_cast<const nn::PolicyModel*>(&m_), "rollout worker: model family '{}' is no nn::PolicyModel",
              m_.family());
  s_.validate("rollout worker: ");
}

WorkerStats RolloutWorker::run(const std::vector<RolloutRequest>& reqs, const std::string& path,
                               int64_t die_after) const {
  NoGradGuard ng;
  const auto t0 = std::chrono::steady_clock::now();
  const auto& p = dynamic_cast<const nn::PolicyModel&>(m_);
  const JournalState js = JournalState::read(path);
  std::FILE* f = std::fopen(path.c_str(), "a");
  ATOLL_CHECK(f, "rollout worker: cannot append to the journal {}", path);
  auto log = [&](char kind, int64_t id, int64_t v) {
    std::fprintf(f, "%c %lld %lld;\n", kind, static_cast<long long>(id), static_cast<long long>(v));
    std::fflush(f);  // in the kernel's page cache: survives the process being killed
  };
  WorkerStats st;
  const int64_t V = dynamic_cast<const nn::TokenModel&>(m_).vocab_size();
  for (const RolloutRequest& r : reqs) {
    auto it = js.requests.find(r.id);
    const std::vector<int32_t>* prefix = it != js.requests.end() ? &it->second.tokens : nullptr;
    if (it != js.requests.end() && it->second.done) {
      ++st.skipped;
      continue;
    }
    (prefix && !prefix->empty() ? st.resumed : st.fresh) += 1;
    const int64_t P = int64_t(r.prompt.size());
    ATOLL_CHECK(P > 0, "rollout worker: request {} has an empty prompt", r.id);
    nn::KVCache cache = p.make_kv_cache(1, P + max_new_);
    Rng rng(s_.seed, uint64_t(r.id));
    Tensor logits = p.forward_cached(Tensor::from_vector_i32(r.prompt, {1, P}), cache, {P});
    bool stopped = false;
    for (int64_t step = 0; step < max_new_; ++step) {
      const int32_t t = nn::sample_token(logits.f32(), V, s_, rng);
      const bool replay = prefix && step < int64_t(prefix->size());
      if (replay) {
        // The journal and the recomputation must agree, or the prefix belongs to another run.
        ATOLL_CHECK(t == (*prefix)[size_t(step)], "rollout journal {}: request {} token {} is {} in the log but {} "
                                                  "recomputed (other weights or seeds?)",
                    path, r.id, step, (*prefix)[size_t(step)], t);
        ++st.replayed_tokens;
      } else {
        if (st.first_token_s < 0)
          st.first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s_.is_stop(t)) {
          stopped = true;
          break;
        }
        log('T', r.id, t);
        ++st.sampled_tokens;
        if (die_after > 0 && st.sampled_tokens >= die_after) std::raise(SIGKILL);
      }
      if (step + 1 == max_new_) break;
      logits = p.forward_cached(Tensor::from_vector_i32({t}, {1, 1}), cache, {1});
    }
    log('D', r.id, stopped ? 1 : 0);
  }
  std::fclose(f);
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace atl::rl
