// Belayer's live takeover (rl.shadow_ranks = 1): the shadow rank of a disaggregated job. It takes
// every weight push as a rollout rank does, so it holds the weights of each version, but generates
// nothing while the rollout ranks live. When a trainer finds its rollout rank dead (the store's
// lifeline, rl/shadow_channel.cpp) it asks the shadow for the batch of the step it waits for; the
// shadow continues the dead rank's journal of that batch (same stream, step, version and weights:
// the same file, rl/belayer.h), so the batch is the one the dead rank would have sent, token for
// token, and from then on serves that rank's trainers as serve() does. The job does not restart.
#include <chrono>
#include <csignal>

#include "core/log.h"
#include "rl/rl_engine.h"

namespace atl::rl {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<Tensor> values_of(const nn::Model& m) {
  std::vector<Tensor> v;
  for (nn::Parameter* p : const_cast<nn::Model&>(m).parameters()) v.push_back(p->value);
  return v;
}

}  // namespace

void RlEngine::serve_shadow() {
  const int T = channel_->trainers(), R = channel_->rollout_ranks();
  // The weights of the last two pushes, by version. One step off (rl.max_staleness 1), a rollout
  // rank generates step k+1's batch with version k while the trainers train step k; dying there, it
  // leaves a journal that needs version k's weights after version k+1 has arrived.
  std::map<int64_t, std::unique_ptr<nn::Model>> held;
  PushHeader last{-1, -1, false, {}}, before{-1, -1, false, {}};
  std::set<int> adopted;                                          // slots whose rank died
  std::map<int, std::pair<int64_t, std::vector<int32_t>>> ready;  // trainer -> (RL step, payload)
  std::set<int> pooled;  // partial rollouts: streams whose carried pool was taken from the dead rank's files
  auto batch = [&](int t, int64_t step, int64_t version) {
    if (c_.partial_tokens > 0 && pooled.insert(t).second) adopt_pool(t, step);  // rl/partial_journal.cpp
    const nn::Model& m = *held.at(version);
    RolloutBatch b = rollouts(m, step, t, false, version);
    return encode_rollouts(b, weights_hash(values_of(m)));
  };
  auto slot_trainers = [&](int slot) {
    std::vector<int> ts;
    for (int t = slot; t < T; t += R) ts.push_back(t);
    return ts;
  };
  // The version serve() generates step's batch with after push h: the previous push's when one
  // step off and that push was the step before (generated after its exchange), else h's own.
  auto version_for = [&](int64_t step) {
    const bool off = c_.max_staleness >= 1 && before.rl_step >= 0 && before.rl_step + 1 == step && step == last.rl_step;
    return off ? before.version : last.version;
  };
  // Hot standby: follow the journals the live rollout ranks write after this push (the batch of
  // this step and, one step off, the next one's), replaying each token as it is logged.
  auto follow_after_push = [&] {
    // A batched journal (partial rollouts' rounds are) is recomputed whole at a takeover.
    if (c_.journal_batched || c_.partial_tokens > 0) return;
    for (auto it = followers_.begin(); it != followers_.end();)
      it = it->second.step < last.rl_step || !held.count(it->second.version) ? followers_.erase(it) : std::next(it);
    for (int t = 0; t < T; ++t) {
      if (adopted.count(t % R)) continue;
      std::vector<std::pair<int64_t, int64_t>> want = {{last.rl_step, version_for(last.rl_step)}};
      if (c_.max_staleness >= 1) want.push_back({last.rl_step + 1, last.version});
      for (auto [step, version] : want) {
        JournalBatch jb = journal_batch(*held.at(version), step, t, version);
        if (followers_.count(jb.path)) continue;
        Followed f;
        f.worker = std::make_unique<RolloutWorker>(*held.at(version), jb.sampling, max_new_);
        f.follower = std::make_unique<JournalFollower>(*f.worker, jb.reqs, jb.path);
        f.trainer = t;
        f.step = step;
        f.version = version;
        followers_.emplace(jb.path, std::move(f));
      }
    }
  };
  auto follow = [&] {
    bool any = false;
    for (auto it = followers_.begin(); it != followers_.end();) {
      try {
        any = it->second.follower->poll() > 0 || any;
        ++it;
      } catch (const std::exception& e) {  // a journal it cannot follow: replayed at a takeover instead
        log::warn("rl: shadow rank stops following {}: {}", it->first, e.what());
        it = followers_.erase(it);
      }
    }
    return any;
  };
  for (;;) {
    const RolloutChannel::ShadowEvent ev = channel_->shadow_wait(last.rl_step, follow);
    if (!ev.asking.empty()) {
      for (int t : ev.asking) {
        auto it = ready.find(t);
        std::vector<int32_t> w;
        const double t0 = now_s();
        if (it != ready.end() && it->second.first == last.rl_step) {
          w = it->second.second;
        } else {
          // The batch the dead rank was to send for last.rl_step, continued from its journal.
          const int64_t version = version_for(last.rl_step);
          w = batch(t, last.rl_step, version);
          const WorkerStats& js = journal_stats_;
          log::warn("rl: shadow rank {} takes over rollout rank {} for trainer {} at RL step {} (version {}): {} "
                    "rollouts already done, {} continued from their prefix ({} tokens replayed, {} of them followed "
                    "before the death), {} started; first new token after {:.1f} ms, batch ready after {:.1f} ms",
                    T + R, T + t % R, t, last.rl_step, version, js.skipped, js.resumed, js.replayed_tokens,
                    js.followed_tokens, js.fresh, js.first_token_s * 1e3, (now_s() - t0) * 1e3);
        }
        adopted.insert(t % R);
        for (auto f = followers_.begin(); f != followers_.end();)  // this rank writes t's journals now
          f = f->second.trainer == t ? followers_.erase(f) : std::next(f);
        channel_->shadow_send(t, w, last.rl_step);
      }
      // One step off: once every trainer of the adopted slots has this step's batch, the next
      // step's, with this push's weights, while they train (as serve() does).
      if (c_.max_staleness >= 1)
        for (int slot : adopted) {
          bool all = true;
          for (int t : slot_trainers(slot)) all = all && channel_->answered(t, last.rl_step);
          for (int t : slot_trainers(slot))
            if (all && (!ready.count(t) || ready[t].first != last.rl_step + 1))
              ready[t] = {last.rl_step + 1, batch(t, last.rl_step + 1, last.version)};
        }
      continue;
    }
    PushHeader h;
    channel_->push(h);
    if (h.stop) break;
    if (c_.kill_shadow_step > 0 && h.rl_step == c_.kill_shadow_step && !h.ahead) std::raise(SIGKILL);  // tests
    // A resumed run's ahead push (PushHeader::ahead) stands for the saving run's push of the step
    // before: its weights are the ones the rollout ranks pre-generate h.rl_step with, and no
    // batch is exchanged after it.
    const bool ahead = h.ahead;
    if (ahead) --h.rl_step;
    before = last;
    last = h;
    // Keep this push's weights under its version; drop those no batch can need any more.
    std::unique_ptr<nn::Model> m;
    for (auto it = held.begin(); it != held.end();)
      if (it->first < before.version) {
        if (!m) m = std::move(it->second);
        it = held.erase(it);
      } else {
        ++it;
      }
    if (!m) m = nn::model_from_metadata(policy_->config_metadata());
    Tensor dst = m->flat_values();
    dst.copy_from(policy_->flat_values());
    held[h.version] = std::move(m);
    for (int slot : ahead ? std::set<int>{} : adopted)
      for (int t : slot_trainers(slot)) {
        auto it = ready.find(t);
        const bool have = it != ready.end() && it->second.first == h.rl_step;
        // Not pre-generated (the slot's trainers were still asking): the weights serve() would have used.
        std::vector<int32_t> w = have ? it->second.second : batch(t, h.rl_step, version_for(h.rl_step));
        channel_->shadow_send(t, w, h.rl_step);
      }
    if (c_.max_staleness >= 1)
      for (int slot : adopted)
        for (int t : slot_trainers(slot)) ready[t] = {h.rl_step + 1, batch(t, h.rl_step + 1, h.version)};
    follow_after_push();
  }
  followers_.clear();
  stopped_ = true;
}

}  // namespace atl::rl
