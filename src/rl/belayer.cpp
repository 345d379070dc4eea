#include "rl/belayer.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
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
    // Nothing may follow the three fields: a torn line with a new one appended to it ("T 3 1T 3 5;")
    // is a bad line, never a token (run() cuts a torn last line before it appends).
    ATOLL_CHECK(in && (kind == 'T' || kind == 'D') && (in >> std::ws).eof(), "rollout journal {}: bad line '{}'", path,
                line);
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

// A kill mid-write leaves the journal's last line without its newline: cut it, so that the next
// append starts a line of its own (the token it held is sampled again, from the same state).
void cut_torn_tail(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
  if (keep < text.size()) std::filesystem::resize_file(path, keep);
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
  if (js.torn_lines > 0) cut_torn_tail(path);  // appending to it would glue the next line on
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

WorkerStats RolloutWorker::run_batched(const std::vector<RolloutRequest>& reqs, const std::string& path,
                                       int64_t die_after) const {
  NoGradGuard ng;
  const auto t0 = std::chrono::steady_clock::now();
  const auto& p = dynamic_cast<const nn::PolicyModel&>(m_);
  const auto& tm = dynamic_cast<const nn::TokenModel&>(m_);
  const int64_t V = tm.vocab_size(), B = int64_t(reqs.size()), block = tm.max_sequence_length();
  ATOLL_CHECK(B > 0, "rollout worker: no requests");
  // The lines already journaled (complete ones: a torn last line is cut off before appending).
  std::vector<std::string> have;
  {
    std::ifstream in(path, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t at = 0, nl;
    while ((nl = text.find('\n', at)) != std::string::npos) {
      have.push_back(text.substr(at, nl - at));
      at = nl + 1;
    }
    if (at < text.size()) std::filesystem::resize_file(path, at);
  }
  WorkerStats st;
  st.journal_s = since(t0);
  std::FILE* f = std::fopen(path.c_str(), "a");
  ATOLL_CHECK(f, "rollout worker: cannot append to the journal {}", path);
  size_t line = 0;  // lines emitted so far: the first have.size() are checked, not written
  char buf[64];
  auto emit = [&](char kind, int64_t id, int64_t v) {
    std::snprintf(buf, sizeof buf, "%c %lld %lld;", kind, static_cast<long long>(id), static_cast<long long>(v));
    if (line < have.size()) {
      ATOLL_CHECK(have[line] == buf, "rollout journal {}: line {} is '{}' in the log but '{}' recomputed (other "
                                     "weights or seeds?)",
                  path, line + 1, have[line], buf);
    } else {
      std::fprintf(f, "%s\n", buf);
      std::fflush(f);
    }
    return line++ >= have.size();
  };
  const JournalState js = JournalState::read(path);
  for (const RolloutRequest& r : reqs) {
    auto it = js.requests.find(r.id);
    if (it == js.requests.end()) ++st.fresh;
    else (it->second.done ? st.skipped : st.resumed) += 1;
  }
  // generate_batch's calls (models/gpt/generate.cpp), for contexts that fit the model's window.
  int64_t longest = 0, Tp = 0;
  for (const RolloutRequest& r : reqs) {
    ATOLL_CHECK(!r.prompt.empty(), "rollout worker: request {} has an empty prompt", r.id);
    longest = std::max(longest, int64_t(r.prompt.size()) + max_new_);
    Tp = std::max(Tp, int64_t(r.prompt.size()));
  }
  ATOLL_CHECK(block == 0 || longest <= block, "rollout worker: prompt + max_new_tokens ({}) passes the model's "
              "context ({}); the batched journal does not shift contexts", longest, block);
  const auto tp = std::chrono::steady_clock::now();
  nn::KVCache cache = p.make_kv_cache(B, block > 0 ? std::min(block, longest) : longest);
  std::vector<Rng> rng;
  std::vector<int64_t> n(static_cast<size_t>(B));
  Tensor tok = Tensor::zeros({B, Tp}, DType::i32);
  for (int64_t b = 0; b < B; ++b) {
    rng.emplace_back(s_.seed, uint64_t(b));
    const auto& pr = reqs[size_t(b)].prompt;
    n[size_t(b)] = int64_t(pr.size());
    std::copy(pr.begin(), pr.end(), tok.i32() + b * Tp);
  }
  Tensor logits = Tensor::zeros({B, V});
  {
    Tensor lg = p.forward_cached(tok, cache, n);
    std::copy(lg.f32(), lg.f32() + B * V, logits.f32());
  }
  st.prefill_s = since(tp);
  std::vector<int32_t> last(static_cast<size_t>(B));
  std::vector<bool> done(static_cast<size_t>(B), false);
  for (int64_t step = 0; step < max_new_; ++step) {
    std::vector<int64_t> decode;
    for (int64_t b = 0; b < B; ++b) {
      if (done[size_t(b)]) continue;
      const int64_t id = reqs[size_t(b)].id;
      const int32_t t = nn::sample_token(logits.f32() + b * V, V, s_, rng[size_t(b)]);
      if (s_.is_stop(t)) {
        done[size_t(b)] = true;
        if (emit('D', id, 1) && st.first_token_s < 0) st.first_token_s = since(t0);
        continue;
      }
      if (emit('T', id, t)) {
        if (st.first_token_s < 0) st.first_token_s = since(t0);
        ++st.sampled_tokens;
        if (die_after > 0 && st.sampled_tokens >= die_after) std::raise(SIGKILL);
      } else {
        ++st.replayed_tokens;
      }
      last[size_t(b)] = t;
      if (step + 1 < max_new_) decode.push_back(b);
    }
    if (step + 1 == max_new_ || decode.empty()) break;
    Tensor one = Tensor::zeros({B, 1}, DType::i32);
    std::vector<int64_t> n1(static_cast<size_t>(B), 0);
    for (int64_t b : decode) {
      one.i32()[b] = last[size_t(b)];
      n1[size_t(b)] = 1;
    }
    const auto tf = std::chrono::steady_clock::now();
    Tensor lg = p.forward_cached(one, cache, n1);
    // Only the fed rows' logits are new (generate.cpp keeps the others' stale ones; they are done).
    for (int64_t b : decode) std::copy(lg.f32() + b * V, lg.f32() + (b + 1) * V, logits.f32() + b * V);
    if (st.first_token_s < 0) st.replay_s += since(tf);
  }
  for (int64_t b = 0; b < B; ++b)
    if (!done[size_t(b)]) emit('D', reqs[size_t(b)].id, 0);
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
    ATOLL_CHECK(in && (kind == 'T' || kind == 'D') && (in >> std::ws).eof(), "rollout journal {}: bad line '{}'", path_,
                line);
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
