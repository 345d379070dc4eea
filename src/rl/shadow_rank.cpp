// Belayer's live takeover (rl.shadow_ranks = 1): the shadow rank of a disaggregated job. It takes
// every weight push as a rollout rank does, so it holds the weights of each version, but generates
// nothing while the rollout ranks live. When a trainer finds its rollout rank dead (the store's
// lifeline, rl/shadow_channel.cpp) it asks the shadow for the batch of the step it waits for; the
// shadow continues the dead rank's journal of that batch (same stream, step, version and weights:
// the same file, rl/belayer.h), so the batch is the one the dead rank would have sent, token for
// token, and from then on serves that rank's trainers as serve() does. The job does not restart.
#include <chrono>

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
  // One step off (rl.max_staleness 1), a rollout rank generates step k+1's batch with version k while
  // the trainers train step k; dying there, it leaves a journal that needs version k's weights after
  // version k+1 has arrived: the shadow keeps the previous push's weights too.
  std::unique_ptr<nn::Model> prev = nn::model_from_metadata(policy_->config_metadata());
  PushHeader last{-1, -1, false}, before{-1, -1, false};
  std::set<int> adopted;                                          // slots whose rank died
  std::map<int, std::pair<int64_t, std::vector<int32_t>>> ready;  // trainer -> (RL step, payload)
  auto batch = [&](int t, int64_t step, const nn::Model& m, int64_t version) {
    RolloutBatch b = rollouts(m, step, t, false, version);
    return encode_rollouts(b, weights_hash(values_of(m)));
  };
  auto slot_trainers = [&](int slot) {
    std::vector<int> ts;
    for (int t = slot; t < T; t += R) ts.push_back(t);
    return ts;
  };
  for (;;) {
    const RolloutChannel::ShadowEvent ev = channel_->shadow_wait(last.rl_step);
    if (!ev.asking.empty()) {
      for (int t : ev.asking) {
        // The batch the dead rank was to send for last.rl_step: serve() generated it after the
        // previous push's exchange when one step off (with that push's weights), else after this push.
        const bool off = c_.max_staleness >= 1 && before.rl_step >= 0 && before.rl_step + 1 == last.rl_step;
        auto it = ready.find(t);
        std::vector<int32_t> w;
        const double t0 = now_s();
        if (it != ready.end() && it->second.first == last.rl_step) {
          w = it->second.second;
        } else {
          w = off ? batch(t, last.rl_step, *prev, before.version) : batch(t, last.rl_step, *policy_, last.version);
          const WorkerStats& js = journal_stats_;
          log::warn("rl: shadow rank {} takes over rollout rank {} for trainer {} at RL step {} (version {}): {} "
                    "rollouts already done, {} continued from their prefix ({} tokens replayed), {} started; first "
                    "new token after {:.1f} ms, batch ready after {:.1f} ms",
                    T + R, T + t % R, t, last.rl_step, off ? before.version : last.version, js.skipped, js.resumed,
                    js.replayed_tokens, js.fresh, js.first_token_s * 1e3, (now_s() - t0) * 1e3);
        }
        adopted.insert(t % R);
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
              ready[t] = {last.rl_step + 1, batch(t, last.rl_step + 1, *policy_, last.version)};
        }
      continue;
    }
    // A push: the previous weights kept, the new ones taken.
    Tensor keep = prev->flat_values();
    keep.copy_from(policy_->flat_values());
    before = last;
    PushHeader h;
    channel_->push(h);
    if (h.stop) break;
    last = h;
    for (int slot : adopted)
      for (int t : slot_trainers(slot)) {
        auto it = ready.find(t);
        const bool have = it != ready.end() && it->second.first == h.rl_step;
        // Not pre-generated (the slot's trainers were still asking): the weights serve() would have used.
        const bool off = c_.max_staleness >= 1 && before.rl_step >= 0 && before.rl_step + 1 == h.rl_step;
        std::vector<int32_t> w = have ? it->second.second
                                      : (off ? batch(t, h.rl_step, *prev, before.version)
                                             : batch(t, h.rl_step, *policy_, h.version));
        channel_->shadow_send(t, w, h.rl_step);
      }
    if (c_.max_staleness >= 1)
      for (int slot : adopted)
        for (int t : slot_trainers(slot)) ready[t] = {h.rl_step + 1, batch(t, h.rl_step + 1, *policy_, h.version)};
  }
  stopped_ = true;
}

}  // namespace atl::rl
