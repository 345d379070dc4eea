#include "rl/partial_rollouts.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "nn/policy_model.h"
#include "rl/rl_engine.h"

namespace atl::rl {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t mix2(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 29);
}

}  // namespace

bool PartialRollouts::Group::complete() const {
  return std::all_of(seqs.begin(), seqs.end(), [](const Seq& s) { return s.done; });
}

RolloutBatch PartialRollouts::step(const nn::Model& gen, int64_t version, Rng& draw, uint64_t seed,
                                   const RoundGen& round_gen) {
  ATOLL_CHECK(c_.partial_tokens > 0, "rl: partial rollouts need rl.partial_tokens > 0");
  const auto& policy = dynamic_cast<const nn::PolicyModel&>(gen);
  nn::SamplingConfig s;
  s.temperature = c_.temperature;
  s.top_k = c_.top_k;
  s.stop_tokens = {kEndMarker};
  double gen_s = 0, score_s = 0;
  int64_t gen_tokens = 0;
  std::vector<Group> done;
  for (int64_t round = 0; int64_t(done.size()) < c_.prompts; ++round) {
    for (int64_t i = 0; i < c_.prompts; ++i) {
      Group g;
      g.problem = task_.draw_train(draw);
      g.uid = next_uid_++;
      for (int64_t k = 0; k < c_.group_size; ++k) {
        Seq q;
        q.prompt = encode(g.problem.prompt);
        g.seqs.push_back(std::move(q));
      }
      pool_.push_back(std::move(g));
    }
    // One round over every unfinished rollout: its prefix is its prompt (+ what it has so far).
    std::vector<Seq*> live;
    std::vector<std::vector<int32_t>> rows;
    std::vector<int64_t> ids;
    for (Group& g : pool_)
      for (size_t k = 0; k < g.seqs.size(); ++k)
        if (Seq& q = g.seqs[k]; !q.done) {
          live.push_back(&q);
          ids.push_back(g.uid * c_.group_size + int64_t(k));
          std::vector<int32_t> row = q.prompt;
          row.insert(row.end(), q.completion.begin(), q.completion.end());
          rows.push_back(std::move(row));
        }
    s.seed = mix2(seed, uint64_t(round));
    double t0 = now_s();
    auto comps = round_gen ? round_gen(rows, ids, s, round) : policy.generate_batch(rows, c_.partial_tokens, s);
    ATOLL_CHECK(comps.size() == rows.size(), "rl: a partial round returned {} completions for {} rollouts", comps.size(),
                rows.size());
    gen_s += now_s() - t0;
    t0 = now_s();
    std::vector<size_t> before(live.size());
    for (size_t r = 0; r < live.size(); ++r) {
      Seq& q = *live[r];
      before[r] = q.completion.size() + (q.stopped ? 1 : 0);
      const size_t room = size_t(c_.max_new) - q.completion.size();
      const auto& t = comps[r].tokens;
      const size_t take = std::min(room, t.size());
      q.completion.insert(q.completion.end(), t.begin(), t.begin() + std::ptrdiff_t(take));
      q.stopped = comps[r].stopped && take == t.size() && take < room;  // the end marker fits in max_new
      q.done = q.stopped || int64_t(q.completion.size()) >= c_.max_new;
      gen_tokens += int64_t(take) + (q.stopped ? 1 : 0);
    }
    // The new tokens' log-probs under this version: the behaviour policy's for the tokens that
    // will be older than the trainer's weights when they are trained on.
    std::vector<Sample> probe;
    for (Seq* q : live) {
      Sample sm;
      sm.prompt = q->prompt;
      sm.completion = q->completion;
      sm.stopped = q->stopped;
      probe.push_back(std::move(sm));
    }
    RolloutBatch pb = pack_rollouts(std::move(probe));
    const Tensor lp = RlEngine::score_logprobs(gen, pb);
    for (size_t r = 0; r < live.size(); ++r) {
      Seq& q = *live[r];
      const size_t n = q.completion.size() + (q.stopped ? 1 : 0);
      for (size_t j = before[r]; j < n; ++j) {
        q.logp.push_back(lp.f32()[int64_t(r) * pb.T + pb.first[r] + int64_t(j)]);
        q.version.push_back(version);
      }
    }
    score_s += now_s() - t0;
    for (auto it = pool_.begin(); it != pool_.end();) {
      if (it->complete()) {
        done.push_back(std::move(*it));
        it = pool_.erase(it);
      } else {
        ++it;
      }
    }
  }
  const double t0 = now_s();
  std::vector<Sample> samples;
  for (size_t gi = 0; gi < done.size(); ++gi)
    for (Seq& q : done[gi].seqs) {
      Sample sm;
      sm.problem = done[gi].problem;
      sm.prompt = q.prompt;
      sm.completion = q.completion;
      sm.stopped = q.stopped;
      sm.reward = task_.score(sm.problem, decode(sm.completion), sm.stopped, c_.format_reward);
      sm.group = int64_t(gi);
      sm.uid = done[gi].uid;
      sm.token_version = q.version;
      samples.push_back(std::move(sm));
    }
  RolloutBatch b = pack_rollouts(std::move(samples));
  // Tokens of this version: the final batch's scoring pass (what the trainer recomputes, bit for
  // bit, at this version); older ones keep their behaviour log-prob.
  b.old_logp = RlEngine::score_logprobs(gen, b);
  int64_t oldest = version, row = 0;
  for (Group& g : done)
    for (Seq& q : g.seqs) {
      for (size_t j = 0; j < q.version.size(); ++j)
        if (q.version[j] != version) b.old_logp.f32()[row * b.T + b.first[size_t(row)] + int64_t(j)] = q.logp[j];
      for (int64_t v : q.version) oldest = std::min(oldest, v);
      ++row;
    }
  b.policy_version = oldest;
  b.gen_version = version;
  b.gen_s = gen_s;
  b.score_s = score_s + (now_s() - t0);
  b.gen_tokens = gen_tokens;
  return b;
}

namespace {

// Words: an int64 as two, a float as its bits, a vector or string as its length then its items.
constexpr int32_t kPoolFormat = 0x50525231;  // "PRR1"

struct Writer {
  std::vector<int32_t> w;
  void i64(int64_t v) {
    w.push_back(int32_t(uint32_t(uint64_t(v))));
    w.push_back(int32_t(uint32_t(uint64_t(v) >> 32)));
  }
  void str(const std::string& s) {
    i64(int64_t(s.size()));
    for (char c : s) w.push_back(int32_t(static_cast<unsigned char>(c)));
  }
  void toks(const std::vector<int32_t>& t) {
    i64(int64_t(t.size()));
    w.insert(w.end(), t.begin(), t.end());
  }
};

struct Reader {
  const std::vector<int32_t>& w;
  const std::string& what;
  size_t at = 0;
  int32_t word() {
    ATOLL_CHECK(at < w.size(), "checkpoint: '{}' ends early (partial-rollout pool of {} words)", what, w.size());
    return w[at++];
  }
  int64_t i64() {
    const uint64_t lo = uint32_t(word()), hi = uint32_t(word());
    return int64_t(lo | (hi << 32));
  }
  size_t len() {
    const int64_t n = i64();
    ATOLL_CHECK(n >= 0 && uint64_t(n) <= w.size() - at, "checkpoint: '{}' has a bad length {} at word {}", what, n, at);
    return size_t(n);
  }
  std::string str() {
    std::string s(len(), '\0');
    for (char& c : s) c = char(word());
    return s;
  }
  std::vector<int32_t> toks() {
    const size_t n = len();
    std::vector<int32_t> t(w.begin() + std::ptrdiff_t(at), w.begin() + std::ptrdiff_t(at + n));
    at += n;
    return t;
  }
};

}  // namespace

std::vector<int32_t> PartialRollouts::save() const {
  Writer o;
  o.w.push_back(kPoolFormat);
  o.i64(next_uid_);
  o.i64(int64_t(pool_.size()));
  for (const Group& g : pool_) {
    o.str(g.problem.prompt);
    o.str(g.problem.answer);
    o.i64(g.uid);
    o.i64(int64_t(g.seqs.size()));
    for (const Seq& q : g.seqs) {
      o.toks(q.prompt);
      o.toks(q.completion);
      o.i64(int64_t(q.logp.size()));
      for (float f : q.logp) {
        int32_t b;
        std::memcpy(&b, &f, 4);
        o.w.push_back(b);
      }
      o.i64(int64_t(q.version.size()));
      for (int64_t v : q.version) o.i64(v);
      o.w.push_back(int32_t(q.done) | int32_t(q.stopped) << 1);
    }
  }
  return o.w;
}

void PartialRollouts::load(const std::vector<int32_t>& words, const std::string& what) {
  Reader in{words, what};
  ATOLL_CHECK(in.word() == kPoolFormat, "checkpoint: '{}' is not a partial-rollout pool", what);
  std::deque<Group> pool;
  const int64_t uid = in.i64();
  for (size_t n = in.len(); n > 0; --n) {
    Group g;
    g.problem.prompt = in.str();
    g.problem.answer = in.str();
    g.uid = in.i64();
    for (size_t k = in.len(); k > 0; --k) {
      Seq q;
      q.prompt = in.toks();
      q.completion = in.toks();
      for (size_t j = in.len(); j > 0; --j) {
        const int32_t b = in.word();
        float f;
        std::memcpy(&f, &b, 4);
        q.logp.push_back(f);
      }
      for (size_t j = in.len(); j > 0; --j) q.version.push_back(in.i64());
      const int32_t flags = in.word();
      q.done = flags & 1;
      q.stopped = flags & 2;
      ATOLL_CHECK(q.logp.size() == q.version.size() &&
                      q.version.size() == q.completion.size() + (q.stopped ? 1 : 0) &&
                      int64_t(q.completion.size()) <= c_.max_new,
                  "checkpoint: '{}': a carried rollout of group {} is inconsistent ({} tokens, {} log-probs, {} versions; "
                  "rl.max_new_tokens {})",
                  what, g.uid, q.completion.size(), q.logp.size(), q.version.size(), c_.max_new);
      g.seqs.push_back(std::move(q));
    }
    ATOLL_CHECK(int64_t(g.seqs.size()) == c_.group_size, "checkpoint: '{}': group {} has {} rollouts, rl.group_size is {}",
                what, g.uid, g.seqs.size(), c_.group_size);
    pool.push_back(std::move(g));
  }
  ATOLL_CHECK(in.at == words.size(), "checkpoint: '{}' has {} words after the pool", what, words.size() - in.at);
  pool_ = std::move(pool);
  next_uid_ = uid;
}

}  // namespace atl::rl
