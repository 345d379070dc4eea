// The disaggregated placement (rl.placement = "disaggregated"; the "disaggregated placement" of
// "Performance Foundations of Parallel & Distributed Reasoning Language Models"): one job whose
// last rl.rollout_ranks ranks only generate and whose others only train. After each update the
// trainers' weights are pushed to the rollout ranks with the bucketed broadcast (rl/weight_sync.h,
// never one message per parameter), then each trainer receives the scored rollouts of its batch.
//
// Job ranks [0, T) train (DDP among themselves), [T, T+R) generate; rollout rank T+i serves the
// trainers t with t % R == i, drawing the prompts trainer t would draw itself when colocated.
// Two groups: the job (the rollout exchange, broadcasts from each rollout rank) and the push group
// (trainer 0 and the rollout ranks, the weight broadcast from trainer 0). Only broadcasts that every
// member enters in the same order are used (Gloo tags collectives by sequence number).
//
// Every pushed version carries the version number; every batch returns the version it was generated
// with and a hash of those weights, which the trainer checks against the hash of its own weights
// at that version, so a rollout rank cannot train the policy on rollouts from other weights.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "rl/rollout.h"
#include "rl/weight_sync.h"

namespace atl::rl {

struct PushHeader {
  int64_t version = 0;  // optimizer steps the pushed weights have taken
  int64_t rl_step = 0;  // the RL step whose rollouts the receivers generate next
  bool stop = false;    // the run is over: rollout ranks return
  // A resumed run's first push: every trainer stream's carried partial-rollout pool from the
  // checkpoint (encode_pools), which the rollout ranks continue. Empty otherwise.
  std::vector<int32_t> pools;
  // One step off, a resumed run's first push: the weights of `version`, the ones the saving run's
  // rollout ranks had pre-generated RL step rl_step with while its trainers trained the step before.
  // The receivers generate rl_step's batch with them and keep it (no exchange follows); the next
  // push is the resumed step's own. Without it they would regenerate that batch with the newest weights.
  bool ahead = false;
};

// Pools by trainer stream as one word vector for the push, and back.
std::vector<int32_t> encode_pools(const std::map<int, std::vector<int32_t>>& pools);
std::map<int, std::vector<int32_t>> decode_pools(const std::vector<int32_t>& words);

class RolloutChannel {
 public:
  // Collective over `job` (every rank, once): splits off the push group. params: this rank's model
  // parameters in order (the same shapes on every rank).
  // shadow_ranks = 1 (rl.shadow_ranks, rl/shadow_rank.h): the job's last rank is Belayer's shadow,
  // and every link is a group of its own, split now while every rank is alive (below).
  RolloutChannel(std::unique_ptr<comm::Communicator> job, int rollout_ranks, std::vector<Tensor> params,
                 double bucket_mb, int shadow_ranks = 0);
  ~RolloutChannel();
  bool is_rollout() const { return job_->rank() >= T_ && !is_shadow(); }
  bool is_shadow() const { return S_ > 0 && job_->rank() == T_ + R_; }
  int trainers() const { return T_; }
  int rollout_ranks() const { return R_; }
  // The trainer ranks this rollout rank generates for.
  std::vector<int> served() const;
  // Push group: trainer 0 sends h and its weights, rollout ranks receive both (h filled in); other
  // trainers return at once. The weights' broadcast alone is timed (the header's wait is not).
  SyncStats push(PushHeader& h, double* header_wait_s = nullptr);
  // Every job rank: for each trainer in order, its rollout rank broadcasts the trainer's payload
  // (`mine` holds a rollout rank's, keyed by trainer). Returns this trainer's (empty on rollout ranks).
  // With a shadow: each trainer receives from its rollout rank over their own pair and, when that
  // rank is dead (the store's lifeline says so), asks the shadow for RL step rl_step's batch.
  std::vector<int32_t> exchange(const std::map<int, std::vector<int32_t>>& mine, int64_t rl_step = -1);

  // ---- the shadow's side (is_shadow()) ----
  struct ShadowEvent {
    bool push = false;        // trainer 0 is about to push: call push()
    std::vector<int> asking;  // trainers whose rollout rank is dead, asking for RL step `last_step`
  };
  // Waits (polling the store) until trainer 0 pushes again or a trainer asks for last_step's batch;
  // a trainer's question is returned once.
  // idle() runs between looks (the shadow follows the journals there); true when it did work.
  ShadowEvent shadow_wait(int64_t last_step, const std::function<bool()>& idle = {});
  // Sends trainer's batch of rl_step over their pair (the trainer's question, if any, is answered).
  void shadow_send(int trainer, const std::vector<int32_t>& words, int64_t rl_step);
  bool answered(int trainer, int64_t rl_step) const { return answered_.count({trainer, rl_step}) > 0; }
  // The lowest trainer rank the job's store knows dead, or -1 (shadow mode; -1 without a store).
  int dead_trainer();
  // Trainers: how many batches this trainer took from the shadow.
  int64_t from_shadow() const { return from_shadow_; }
  // Trainers: when its rollout rank and the shadow are both dead, the trainer generates its own
  // batch of RL step rl_step with f (RlEngine::self_generate: the journal's continuation, the batch
  // the dead ranks would have sent). Without f the job stops naming both ranks.
  void set_self_generate(std::function<std::vector<int32_t>(int64_t)> f) { self_generate_ = std::move(f); }
  int64_t self_generated() const { return self_generated_; }

 private:
  void split_pairs(std::vector<Tensor> params, double bucket_mb);
  std::vector<int32_t> exchange_pairs(const std::map<int, std::vector<int32_t>>& mine, int64_t rl_step);
  SyncStats push_pairs(PushHeader& h, double* header_wait_s);
  bool rank_died(int job_rank);      // waits a moment for the store to see a closed transport
  bool rank_died_now(int job_rank);  // the store's view now

  std::unique_ptr<comm::Communicator> job_, push_;
  std::unique_ptr<WeightSync> sync_;
  int T_ = 0, R_ = 0, S_ = 0;
  // Shadow mode: no collective spans the job after the constructor, so a dead rollout rank breaks
  // only the groups it is in. Trainer 0: push_to_[i] = {0, rollout rank i}, push_shadow_ = {0, shadow};
  // a rollout rank or the shadow: push_ = its group with trainer 0. pair_[t] = {trainer t, its rollout
  // rank} on both ends, shadow_pair_[t] = {trainer t, shadow} on both ends.
  std::vector<std::unique_ptr<comm::Communicator>> push_to_;
  std::unique_ptr<comm::Communicator> push_shadow_;
  std::map<int, std::unique_ptr<comm::Communicator>> pair_, shadow_pair_;
  std::unique_ptr<comm::TcpStore> store_;  // the job's rendezvous store: liveness and the shadow's events
  std::vector<bool> dead_;                 // slots found dead (trainers)
  bool shadow_dead_ = false;               // trainers: the shadow rank was found dead
  int64_t pushes_ = 0, from_shadow_ = 0, seen_events_ = -1;
  std::set<std::pair<int, int64_t>> answered_;  // shadow: questions returned
  std::function<std::vector<int32_t>(int64_t)> self_generate_;
  int64_t self_generated_ = 0;
};

// The push's header (and a resumed run's pools) from g's rank 0, `root` there.
void push_header(comm::Communicator& g, PushHeader& h, bool root);

// A batch of scored rollouts as words for the exchange: each sample's prompt, completion, stop,
// group, reward and problem, the behaviour log-probs [B*T], the generating version, a hash of the
// generating weights and the generation's timings. decode_rollouts re-packs the same [B,T] batch.
std::vector<int32_t> encode_rollouts(const RolloutBatch& b, uint64_t weights_hash);
RolloutBatch decode_rollouts(const std::vector<int32_t>& words, uint64_t* weights_hash);
// Of every bit of every tensor, in order (not a cryptographic hash: it catches wrong or stale
// weights, not an adversary).
uint64_t weights_hash(const std::vector<Tensor>& tensors);

}  // namespace atl::rl
