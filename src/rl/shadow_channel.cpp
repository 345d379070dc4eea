// The disaggregated channel with Belayer's shadow rank (rl.shadow_ranks = 1, rl/shadow_rank.cpp):
// the links that let a job outlive a dead rollout rank. Gloo fails every group a dead process is
// in, so no collective spans the job after setup: each link is a group of its own, split while
// every rank is alive (trainer 0 with each rollout rank and with the shadow for the weight push;
// each trainer with its rollout rank and with the shadow for its batches). A dead rollout rank then
// breaks only its own pairs. Its death is read from the job's store (the rank's lifeline closed
// without a goodbye), never guessed from a slow peer, so the shadow never writes a journal a live
// rank is still writing. The shadow learns of pushes and of trainers' questions through the store
// (it cannot wait in two Gloo groups at once); the data goes over the pairs.
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "rl/disaggregated.h"

namespace atl::rl {
namespace {

constexpr comm::Millis kPushTimeout{24ll * 3600 * 1000};  // as in disaggregated.cpp
constexpr const char* kEvents = "rl/shadow/events";

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A pair's server (the rollout rank or the shadow) is its rank 1: trainers have the lower job ranks.
void send_words(comm::Communicator& c, const std::vector<int32_t>& w) {
  Tensor n = Tensor::zeros({1}, DType::i64);
  n.data<int64_t>()[0] = int64_t(w.size());
  c.broadcast(n, 1);
  Tensor words = Tensor::zeros({std::max<int64_t>(1, int64_t(w.size()))}, DType::i32);
  std::memcpy(words.i32(), w.data(), w.size() * 4);
  c.broadcast(words, 1);
}

std::vector<int32_t> recv_words(comm::Communicator& c) {
  Tensor n = Tensor::zeros({1}, DType::i64);
  c.broadcast(n, 1);
  const int64_t len = n.data<int64_t>()[0];
  Tensor words = Tensor::zeros({std::max<int64_t>(1, len)}, DType::i32);
  c.broadcast(words, 1);
  return std::vector<int32_t>(words.i32(), words.i32() + len);
}

}  // namespace

void RolloutChannel::split_pairs(std::vector<Tensor> params, double bucket_mb) {
  const int me = job_->rank(), shadow = T_ + R_;
  // Every rank takes part in every split (collective over the job), in the same order.
  for (int i = 0; i < R_; ++i) {
    auto g = job_->split(me == 0 || me == T_ + i ? 0 : -1, me);
    if (me == 0) push_to_.push_back(std::move(g));
    else if (g) push_ = std::move(g);
  }
  {
    auto g = job_->split(me == 0 || me == shadow ? 0 : -1, me);
    if (me == 0) push_shadow_ = std::move(g);
    else if (g) push_ = std::move(g);
  }
  for (int t = 0; t < T_; ++t) {
    if (auto g = job_->split(me == t || me == T_ + t % R_ ? 0 : -1, me)) pair_[t] = std::move(g);
    if (auto g = job_->split(me == t || me == shadow ? 0 : -1, me)) shadow_pair_[t] = std::move(g);
  }
  for (auto& g : push_to_) g->set_timeout(kPushTimeout);
  if (push_shadow_) push_shadow_->set_timeout(kPushTimeout);
  if (push_) push_->set_timeout(kPushTimeout);
  if (me == 0 || push_) sync_ = std::make_unique<WeightSync>(std::move(params), bucket_mb);
  dead_.assign(size_t(R_), false);
  const comm::DistEnv env = comm::DistEnv::from_environment();
  ATOLL_CHECK(env.store_port > 0, "rl.shadow_ranks needs the job's rendezvous store (atoll launch)");
  store_ = std::make_unique<comm::TcpStore>(env.store_addr, env.store_port, comm::Millis(60000));
  // What `atoll launch --outlive` may go on without: the rollout ranks (the shadow takes over). A
  // trainer is not one: the trainers are one data-parallel group (every step's gradients are
  // all-reduced over all of them, and Gloo fails a group a member of which died), so the job stops
  // naming it and resumes from its last checkpoint (docs/rl.md).
  if (me == 0) {
    // The shadow too: its death leaves the rollout ranks serving (without a spare from then on).
    for (int i = 0; i <= R_; ++i) store_->set(fmt::format("launch/outlivable/{}", T_ + i), "1");
    store_->set("launch/outlive_declared",
                fmt::format("an RL job goes on without its rollout ranks and shadow only; {} as one data-parallel "
                            "group: resume the job from its last checkpoint",
                            T_ == 1 ? std::string("rank 0 trains") : fmt::format("ranks 0-{} train", T_ - 1)));
  }
}

int RolloutChannel::dead_trainer() {
  if (!store_) return -1;
  try {
    for (int d : store_->dead_ranks())
      if (d < T_) return d;
  } catch (const std::exception&) {
  }
  return -1;
}

bool RolloutChannel::rank_died(int job_rank) {
  // The transport often sees the closed connection a moment before the store does.
  for (int i = 0; i < 100; ++i) {
    for (int d : store_->dead_ranks())
      if (d == job_rank) return true;
    std::this_thread::sleep_for(comm::Millis(20));
  }
  return false;
}

bool RolloutChannel::rank_died_now(int job_rank) {
  for (int d : store_->dead_ranks())
    if (d == job_rank) return true;
  return false;
}

SyncStats RolloutChannel::push_pairs(PushHeader& h, double* header_wait_s) {
  SyncStats st;
  double wait = 0;
  auto push_one = [&](comm::Communicator& g) {
    const double t0 = now_s();
    push_header(g, h, true);
    wait += now_s() - t0;
    if (h.stop) return;
    const SyncStats s = sync_->broadcast(g, 0);
    st.seconds += s.seconds;
    st.bytes += s.bytes;
    st.buckets += s.buckets;
  };
  for (int i = 0; i < R_; ++i) {
    if (dead_[size_t(i)]) continue;
    try {
      push_one(*push_to_[size_t(i)]);
    } catch (const std::exception& e) {
      if (!rank_died(T_ + i)) throw;
      dead_[size_t(i)] = true;
      log::warn("rl: rollout rank {} is gone ({}); its trainers take their batches from the shadow rank {}", T_ + i,
                e.what(), T_ + R_);
    }
  }
  // The shadow follows every push (weights already loaded when it takes over). A dead shadow is
  // left out: the live rollout ranks go on serving, and a later rollout rank's death stops the job.
  if (!shadow_dead_) {
    store_->set(fmt::format("rl/shadow/push/{}", pushes_++), "1");
    store_->add(kEvents, 1);
    try {
      push_one(*push_shadow_);
    } catch (const std::exception& e) {
      if (!rank_died(T_ + R_)) throw;
      shadow_dead_ = true;
      log::warn("rl: the shadow rank {} is gone ({}); the rollout ranks go on without a spare", T_ + R_, e.what());
    }
  }
  if (header_wait_s) *header_wait_s = wait;
  return st;
}

std::vector<int32_t> RolloutChannel::exchange_pairs(const std::map<int, std::vector<int32_t>>& mine, int64_t rl_step) {
  const int me = job_->rank();
  if (me >= T_) {  // a rollout rank: each of its trainers' batches over their pair
    for (const auto& [t, w] : mine) send_words(*pair_.at(t), w);
    return {};
  }
  const int slot = me % R_, server = T_ + slot;
  if (!dead_[size_t(slot)]) {
    try {
      return recv_words(*pair_.at(me));
    } catch (const std::exception& e) {
      if (!rank_died(server)) throw;  // a live rank that is slow or broken: not the shadow's to continue
      dead_[size_t(slot)] = true;
      log::warn("rl: rollout rank {} is gone ({}); trainer {} takes its batches from the shadow rank {} from RL "
                "step {} on",
                server, e.what(), me, T_ + R_, rl_step);
    }
  }
  const int shadow = T_ + R_;
  auto no_spare = [&](const std::string& why) -> std::vector<int32_t> {
    if (self_generate_) {  // the trainer continues the slot's journal itself (same batch, slower)
      if (self_generated_++ == 0)
        log::warn("rl: trainer {} generates its own batches from RL step {} on: its rollout rank {} and the shadow "
                  "rank {} are both gone ({}); it continues their journal",
                  me, rl_step, server, shadow, why);
      return self_generate_(rl_step);
    }
    fail("rl: trainer {} cannot go on: its rollout rank {} died and the shadow rank {} is gone too ({}); resume the "
         "job from its last checkpoint",
         me, server, shadow, why);
    return {};
  };
  if (self_generated_ > 0 || shadow_dead_ || rank_died_now(shadow))
    return no_spare("its connection to the rendezvous store closed");
  store_->set(fmt::format("rl/shadow/ask/{}/{}", me, rl_step), "1");
  store_->add(kEvents, 1);
  try {
    std::vector<int32_t> w = recv_words(*shadow_pair_.at(me));
    ++from_shadow_;
    return w;
  } catch (const std::exception& e) {
    if (!rank_died(shadow)) throw;
    shadow_dead_ = true;
    return no_spare(e.what());
  }
}

RolloutChannel::ShadowEvent RolloutChannel::shadow_wait(int64_t last_step, const std::function<bool()>& idle) {
  const double deadline = now_s() + double(kPushTimeout.count()) / 1e3;
  double next_look = 0;
  for (;;) {
    const int64_t e = store_->add(kEvents, 0);
    if (e != seen_events_) {
      seen_events_ = e;
      ShadowEvent ev;
      // Questions first: trainer 0 cannot push again before every trainer has this step's batch.
      for (int t = 0; t < T_ && last_step >= 0; ++t)
        if (!answered(t, last_step) && store_->check({fmt::format("rl/shadow/ask/{}/{}", t, last_step)})) {
          answered_.insert({t, last_step});
          ev.asking.push_back(t);
        }
      if (ev.asking.empty() && store_->check({fmt::format("rl/shadow/push/{}", pushes_)})) {
        ++pushes_;
        ev.push = true;
      }
      if (ev.push || !ev.asking.empty()) {
        seen_events_ = -1;  // the next call looks again at once (questions may already wait)
        return ev;
      }
    }
    ATOLL_CHECK(now_s() < deadline, "rl: the shadow rank heard nothing from the trainers for {} s",
                kPushTimeout.count() / 1000);
    // Not a Gloo wait: a dead trainer would leave the shadow polling; it stops naming the trainer.
    if (now_s() >= next_look) {
      next_look = now_s() + 0.25;
      const int t = dead_trainer();
      ATOLL_CHECK(t < 0, "rl: trainer rank {} died (its connection to the rendezvous store closed); the shadow rank "
                         "stops: the trainers are one data-parallel group, so the job resumes from its last checkpoint",
                  t);
    }
    if (!(idle && idle())) std::this_thread::sleep_for(comm::Millis(2));
  }
}

void RolloutChannel::shadow_send(int trainer, const std::vector<int32_t>& words, int64_t rl_step) {
  answered_.insert({trainer, rl_step});
  send_words(*shadow_pair_.at(trainer), words);
}

}  // namespace atl::rl
