#include "rl/partial_rollouts.h"

#include <algorithm>
#include <chrono>

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

RolloutBatch PartialRollouts::step(const nn::Model& gen, int64_t version, Rng& draw, uint64_t seed) {
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
    for (Group& g : pool_)
      for (Seq& q : g.seqs)
        if (!q.done) {
          live.push_back(&q);
          std::vector<int32_t> row = q.prompt;
          row.insert(row.end(), q.completion.begin(), q.completion.end());
          rows.push_back(std::move(row));
        }
    s.seed = mix2(seed, uint64_t(round));
    double t0 = now_s();
    auto comps = policy.generate_batch(rows, c_.partial_tokens, s);
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

}  // namespace atl::rl
