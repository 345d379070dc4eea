// The RL post-training loop's steps, driven by the trainer through the "rl" task
// (train/rl_task.cpp): each trainer step asks for a batch (generate → score), then for its loss
// (train); the trainer's backward and optimizer step follow, and the next batch request syncs the
// weights where the placement needs it.
//
// Placements ([rl] placement; the taxonomy of "Performance Foundations of Parallel & Distributed
// Reasoning Language Models"):
//   colocated  generation and training time-share every rank; multi-rank through the trainer's
//              DDP (each rank generates its own prompts, groups never span ranks; the weights stay
//              identical, so nothing is synced)
//   async      one-step-off-policy: a rollout copy of the policy generates the batch of step k+1 on a
//              second thread while step k trains; after each update the weights are copied into it
//              in flat buckets (rl/weight_sync.h). Staleness is at most 1 update; the clipped ratio
//              pi_theta / pi_behaviour is the importance correction.
//   disaggregated  the job's last rl.rollout_ranks ranks only generate, the others only train;
//              weights are pushed to the rollout ranks by bucketed broadcast before each RL step
//              (rl/disaggregated.h). rl.max_staleness 0: generation waits for the push (on-policy);
//              1: the rollout ranks generate step k+1 while the trainers train step k.
// Before the RL steps, rl.sft_steps steps of supervised warm start on generated demonstrations
// (weighted cross-entropy on the answer tokens). The frozen reference is the policy as the first
// RL step finds it.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "comm/communicator.h"
#include "nn/model.h"
#include "nn/policy_model.h"
#include "rl/belayer.h"
#include "rl/disaggregated.h"
#include "rl/partial_rollouts.h"
#include "rl/rl_config.h"
#include "rl/rollout.h"
#include "rl/weight_sync.h"
#include "optim/optimizer.h"

namespace atl::rl {

class RlEngine {
 public:
  RlEngine(RlConfig c);
  ~RlEngine();
  // disaggregated: how many of a job of `world` ranks generate only (its last ones); 0 otherwise.
  int reserved_ranks(int world) const;
  // disaggregated, before setup on every rank: the whole job's communicator and this rank's role.
  void attach_job(std::unique_ptr<comm::Communicator> job, bool rollout_rank);
  // A rollout rank's whole run: receive weights, generate and send rollouts until the trainers stop.
  void serve();
  // Once the model is built (its weights may still change before the first step).
  void setup(nn::Model& model, comm::Communicator* comm, int rank, int world);
  // The next micro-batch: SFT demonstrations, or scored rollouts (reused rl.epochs times).
  const RolloutBatch& next_batch();
  // The loss of the batch next_batch() returned (records the graph).
  Tensor loss(const nn::Model& model, const RolloutBatch& b);
  // Greedy held-out accuracy over the whole job (collective).
  double heldout_accuracy(const nn::Model& model);
  std::string sample(const nn::Model& model);
  // What this step measured, for metrics.jsonl (reward, KL, entropy, time split...).
  nlohmann::json step_metrics();
  // rl.lr_scale during the RL steps, 1 during SFT.
  float lr_multiplier() const { return sft_phase_ ? 1.0f : c_.lr_scale; }
  int64_t tokens_per_batch() const;
  int64_t sequence_length() const;
  // Checkpointed tensors ("task.rl." names): the frozen reference once taken, the async rollout
  // copy, PPO's value head (weights, pending gradients, AdamW state), the carried partial groups
  // (colocated; collective there: every rank's pool). load_tensors restores them.
  void save_tensors(std::vector<std::pair<std::string, Tensor>>& out) const;
  void load_tensors(const std::vector<std::pair<std::string, Tensor>>& in);
  nlohmann::json state() const;
  void set_state(const nlohmann::json& j);

  const RolloutBatch& current() const { return cur_; }
  // PPO's value head (empty for the other algorithms).
  const std::vector<ParamRef>& value_head() const { return vrefs_; }
  const RlConfig& config() const { return c_; }
  const VerifiableTask& task() const { return *task_; }
  const std::vector<Problem>& eval_problems() const { return eval_; }
  int64_t max_new_tokens() const { return max_new_; }
  // Generation + scoring with `gen` as the behaviour policy for rollout step `step` (exposed for tests).
  // seed_rank: whose prompts and sampling streams (-1: this rank's; a rollout rank draws its trainers').
  // version: the updates gen's weights have seen. With rl.partial_tokens, rollouts carried from earlier
  // calls of the same seed_rank are continued (rl/partial_rollouts.h).
  RolloutBatch rollouts(const nn::Model& gen, int64_t step, int seed_rank = -1, bool with_ref = true,
                        int64_t version = 0);
  // Partial rollouts with rl.journal_dir: take seed_rank's stream over at `step` with the pool its
  // (dead) process carried into it, as the shadow rank does (rl/partial_journal.cpp; public for tests).
  void adopt_pool(int seed_rank, int64_t step);
  // rl.journal_dir: what the last journaled generation did (requests resumed, tokens replayed...).
  const WorkerStats& journal_stats() const { return journal_stats_; }
  // Fault injection (tests): the journaled generation raises SIGKILL after this many new tokens,
  // counted over every batch this process journals (so a test can kill it in its third batch).
  int64_t journal_die_after = 0;
  // log pi(target) of every row of b under m: the same forward and batch shape as the loss.
  static Tensor score_logprobs(const nn::Model& m, const RolloutBatch& b);

 private:
  void sync_rollout_model();
  void disaggregated_batch(int64_t updates);
  void serve_shadow();  // rl.shadow_ranks: the shadow rank's run (rl/shadow_rank.cpp)
  // rl.shadow_ranks, a trainer whose rollout rank and shadow are both dead: its own batch of RL
  // step `step`, continued from the slot's journal with the weights serve() would have used.
  std::vector<int32_t> self_generate(int64_t step);
  void keep_pushed(int64_t version, int64_t rl_step, const nn::Model& weights);
  void step_value_head();
  RolloutBatch sft_batch();
  std::vector<nn::PolicyModel::Completion> journaled_generate(const nn::Model& gen,
                                                              const std::vector<std::vector<int32_t>>& rows,
                                                              const nn::SamplingConfig& s, int64_t step, int seed_rank,
                                                              int64_t version);
  PartialRollouts& pool_for(int seed_rank);
  // rl.partial_tokens with rl.journal_dir (rl/partial_journal.cpp): each round of seed_rank's step
  // journaled (RolloutWorker::run_batched), continued over a dead process's lines; the pool carried
  // into step + 1 is then written beside the journals (pool_path), before the batch is sent.
  RolloutBatch journaled_partial(const nn::Model& gen, PartialRollouts& pool, int64_t step, int seed_rank,
                                 int64_t version, Rng& draw, uint64_t seed);
  std::string pool_path(int seed_rank, int64_t step) const;
  void write_pool(int seed_rank, int64_t step);
  // A rollout rank: a resumed run's pools from the first push (its own streams; journaled: written).
  void take_resume_pools(const PushHeader& h);
  // A step's prompts (rl.prompts groups of rl.group_size rows) and sampling, from its stream's rng.
  void draw_batch(Rng& rng, uint64_t seed, std::vector<Problem>& probs, std::vector<std::vector<int32_t>>& rows,
                  nn::SamplingConfig& s) const;
  // rl.journal_dir: the requests, sampling and journal file of seed_rank's batch of `step` by gen
  // at `version` (what journaled_generate writes; what the shadow rank follows).
  struct JournalBatch {
    std::vector<RolloutRequest> reqs;
    nn::SamplingConfig sampling;
    std::string path;
  };
  JournalBatch journal_batch(const nn::Model& gen, int64_t step, int seed_rank, int64_t version) const;
  // The shadow rank's followers of the journals its rollout ranks write, by path (shadow_rank.cpp).
  struct Followed {
    std::unique_ptr<RolloutWorker> worker;
    std::unique_ptr<JournalFollower> follower;
    int trainer = 0;
    int64_t step = 0, version = 0;
  };
  std::map<std::string, Followed> followers_;  // rl.partial_tokens: the carried groups of seed_rank's stream
  // The value head on m's features, no graph: PPO's old values. [B*T]
  Tensor values(const nn::Model& m, const RolloutBatch& b) const;

  RlConfig c_;
  std::unique_ptr<VerifiableTask> task_;
  std::vector<Problem> eval_;
  int64_t max_new_ = 8;
  nn::Model* policy_ = nullptr;
  comm::Communicator* comm_ = nullptr;
  int rank_ = 0, world_ = 1;
  std::unique_ptr<nn::Model> ref_, rollout_;
  std::unique_ptr<WeightSync> sync_;
  // disaggregated
  std::unique_ptr<comm::Communicator> job_;
  bool rollout_rank_ = false;
  std::unique_ptr<RolloutChannel> channel_;
  std::map<int64_t, uint64_t> pushed_hash_;  // version -> hash of the weights pushed at it
  // rl.shadow_ranks, trainers: the last pushes' weights and RL steps by version (self_generate).
  std::map<int64_t, std::pair<int64_t, std::unique_ptr<nn::Model>>> pushed_;
  bool self_pooled_ = false;  // partial rollouts: this stream's pool taken from the journal directory
  bool stopped_ = false;
  std::map<int, std::unique_ptr<PartialRollouts>> partial_;  // by seed rank (a rollout rank serves several)
  std::vector<int32_t> carried_;       // disaggregated trainer: its stream's pool after the last batch
  std::vector<int32_t> resume_pools_;  // trainer 0 of a resumed run: every stream's pool, for the first push
  // One step off (rl.max_staleness 1): the last push's version and weights hash (every trainer) and
  // weights (trainer 0), checkpointed, so a resumed run first pushes them `ahead` (PushHeader) and the
  // rollout ranks pre-generate the resumed step as the saving run's did. -1: none (on policy, SFT).
  std::unique_ptr<nn::Model> behind_;
  int64_t behind_version_ = -1;
  uint64_t behind_hash_ = 0;
  bool push_behind_ = false;  // resumed with behind_: the next push is the ahead one first
  bool ref_ready_ = false, rollout_ready_ = false;
  int64_t calls_ = 0, rl_steps_ = 0, epoch_ = 0;
  RolloutBatch cur_;
  // async
  std::thread worker_;
  RolloutBatch pending_;
  double pending_gen_s_ = 0, pending_score_s_ = 0;
  std::string worker_error_;
  // value head (ppo): w [C,1], b [1], its own AdamW (the trainer's optimizer owns the model only)
  Tensor vw_, vb_;
  std::vector<ParamRef> vrefs_;
  std::unique_ptr<Optimizer> vopt_;
  // per-step measurements
  nlohmann::json m_;
  double t_loss_start_ = -1;
  double eval_acc_ = -1;
  bool sft_phase_ = false;
  WorkerStats journal_stats_;
  int64_t journal_sampled_ = 0;  // new tokens this process journaled (journal_die_after)
};

}  // namespace atl::rl
