#include "rl/belayer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>
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

namespace {
double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

DecodeState RolloutWorker::start(const RolloutRequest& r) const {
  const auto& p = dynamic_cast<const nn::PolicyModel&>(m_);
  const int64_t P = int64_t(r.prompt.size());
  ATOLL_CHECK(P > 0, "rollout worker: request {} has an empty prompt", r.id);
  DecodeState d;
  d.id = r.id;
  d.cache = p.make_kv_cache(1, P + max_new_);
  d.rng = Rng(s_.seed, uint64_t(r.id));
  d.logits = p.forward_cached(Tensor::from_vector_i32(r.prompt, {1, P}), d.cache, {P});
  return d;
}

int32_t RolloutWorker::sample(DecodeState& d) const {
  const int64_t V = dynamic_cast<const nn::TokenModel&>(m_).vocab_size();
  ++d.step;
  return nn::sample_token(d.logits.f32(), V, s_, d.rng);
}

void RolloutWorker::feed(DecodeState& d, int32_t token) const {
  const auto& p = dynamic_cast<const nn::PolicyModel&>(m_);
  d.logits = p.forward_cached(Tensor::from_vector_i32({token}, {1, 1}), d.cache, {1});
}

WorkerStats RolloutWorker::run(const std::vector<RolloutRequest>& reqs, const std::string& path, int64_t die_after,
                               JournalFollower* follow) const {
  NoGradGuard ng;
  const auto t0 = std::chrono::steady_clock::now();
  const JournalState js = JournalState::read(path);
  WorkerStats st;
  st.journal_s = since(t0);
  std::FILE* f = std::fopen(path.c_str(), "a");
  ATOLL_CHECK(f, "rollout worker: cannot append to the journal {}", path);
  auto log = [&](char kind, int64_t id, int64_t v) {
    std::fprintf(f, "%c %lld %lld;\n", kind, static_cast<long long>(id), static_cast<long long>(v));
    std::fflush(f);  // in the kernel's page cache: survives the process being killed
  };
  for (const RolloutRequest& r : reqs) {
    auto it = js.requests.find(r.id);
    const std::vector<int32_t>* prefix = it != js.requests.end() ? &it->second.tokens : nullptr;
    if (it != js.requests.end() && it->second.done) {
      ++st.skipped;
      continue;
    }
    (prefix && !prefix->empty() ? st.resumed : st.fresh) += 1;
    DecodeState d;
    // A follower's state is the worker's after the tokens it replayed, when those are the log's.
    if (follow && follow->live_ && follow->live_->id == r.id && prefix &&
        follow->tokens_.size() <= prefix->size() &&
        std::equal(follow->tokens_.begin(), follow->tokens_.end(), prefix->begin())) {
      d = std::move(*follow->live_);
      follow->live_.reset();
      st.followed_tokens += d.step;
      st.replayed_tokens += d.step;
    } else {
      const auto tp = std::chrono::steady_clock::now();
      d = start(r);
      if (st.first_token_s < 0) st.prefill_s += since(tp);
    }
    bool stopped = false;
    while (d.step < max_new_) {
      const int64_t step = d.step;
      const int32_t t = sample(d);
      const bool replay = prefix && step < int64_t(prefix->size());
      if (replay) {
        // The journal and the recomputation must agree, or the prefix belongs to another run.
        ATOLL_CHECK(t == (*prefix)[size_t(step)], "rollout journal {}: request {} token {} is {} in the log but {} "
                                                  "recomputed (other weights or seeds?)",
                    path, r.id, step, (*prefix)[size_t(step)], t);
        ++st.replayed_tokens;
      } else {
        if (st.first_token_s < 0) st.first_token_s = since(t0);
        if (s_.is_stop(t)) {
          stopped = true;
          break;
        }
        log('T', r.id, t);
        ++st.sampled_tokens;
        if (die_after > 0 && st.sampled_tokens >= die_after) std::raise(SIGKILL);
      }
      if (d.step == max_new_) break;
      const auto tf = std::chrono::steady_clock::now();
      feed(d, t);
      if (replay) st.replay_s += since(tf);
    }
    log('D', r.id, stopped ? 1 : 0);
  }
  std::fclose(f);
  st.seconds = since(t0);
  return st;
}

JournalFollower::JournalFollower(const RolloutWorker& w, std::vector<RolloutRequest> reqs, std::string path)
    : w_(w), path_(std::move(path)) {
  for (RolloutRequest& r : reqs) reqs_[r.id] = std::move(r);
}

int64_t JournalFollower::poll() {
  NoGradGuard ng;
  std::ifstream f(path_, std::ios::binary);
  if (!f) return 0;  // not written yet
  f.seekg(offset_);
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  int64_t replayed = 0;
  size_t at = 0, nl;
  // Complete lines only ("K id v;\n"): a line being written is read at the next poll.
  while ((nl = text.find('\n', at)) != std::string::npos) {
    const std::string line = text.substr(at, nl - at);
    at = nl + 1;
    ATOLL_CHECK(!line.empty() && line.back() == ';', "rollout journal {}: bad line '{}'", path_, line);
    std::istringstream in(line.substr(0, line.size() - 1));
    char kind = 0;
    int64_t id = 0, v = 0;
    in >> kind >> id >> v;
    ATOLL_CHECK(in && (kind == 'T' || kind == 'D'), "rollout journal {}: bad line '{}'", path_, line);
    if (kind == 'D') {
      if (live_ && live_->id == id) live_.reset();
      tokens_.clear();
      continue;
    }
    if (!live_ || live_->id != id) {
      auto r = reqs_.find(id);
      ATOLL_CHECK(r != reqs_.end(), "rollout journal {}: request {} is not one of the batch", path_, id);
      live_ = w_.start(r->second);
      tokens_.clear();
    }
    const int32_t t = w_.sample(*live_);
    ATOLL_CHECK(t == int32_t(v), "rollout journal {}: request {} token {} is {} in the log but {} recomputed by the "
                                 "follower (other weights or seeds?)",
                path_, id, live_->step - 1, v, t);
    tokens_.push_back(t);
    if (live_->step < w_.max_new_tokens()) w_.feed(*live_, t);
    ++replayed;
  }
  offset_ += int64_t(at);
  return replayed;
}

}  // namespace atl::rl
