// [rl] keys (docs/rl.md), each read with its range; an out-of-range or unknown value names the
// key and where it was set.
#pragma once
#include <string>

#include "core/config.h"
#include "rl/algorithm.h"
#include "rl/policy_loss.h"
#include "rl/verifiable_task.h"

namespace atl::rl {

struct RlConfig {
  std::string algorithm = "grpo";
  TaskSpec task;
  int heldout_percent = 10;
  int64_t prompts = 8, group_size = 8;  // per rank per step: prompts × group_size rollouts
  int64_t max_new_tokens = 0;           // 0: the task's longest answer + 1 (per turn)
  int64_t turns = 1;                    // > 1: multi-turn episodes, the environment replying (rl/multi_turn.h)
  float temperature = 1.0f;
  int64_t top_k = 0;
  PolicyLossConfig loss;
  AlgorithmConfig alg;
  int64_t epochs = 1;  // optimizer steps on each rollout batch (the clipped ratio matters from the 2nd)
  float vf_coef = 0.5f, value_clip = 0.2f, value_lr = 1e-3f;
  int64_t sft_steps = 0, sft_batch = 64;  // warm start on generated demonstrations before RL
  float format_reward = 0.1f;
  float lr_scale = 0.1f;  // the RL steps' learning rate relative to the schedule (SFT: 1)
  int64_t eval_size = 200;
  int64_t eval_samples = 0;  // > 0: also that many sampled episodes per held-out problem (heldout_sampled_reward)
  std::string placement = "colocated";  // colocated | async (one-step-off-policy) | disaggregated
  int64_t max_staleness = 1;            // async, disaggregated: rollouts at most this many updates old
  int64_t rollout_ranks = 1;
  int64_t partial_tokens = 0;           // > 0: partial rollouts, rounds of this many tokens (rl/partial_rollouts.h)
  int64_t shadow_ranks = 0;             // disaggregated + journal: a spare rank that takes over a dead rollout rank
  double sync_bucket_mb = 4.0;
  std::string journal_dir;  // non-empty: rollouts generated through Belayer's journal there (rl/belayer.h)
  bool journal_batched = false;  // the journaled batch decoded together, bitwise the unjournaled one
  int64_t kill_after_tokens = 0;  // [fault] rl_kill_after_tokens: the journaling process dies (SIGKILL) after so many
  // [fault] rl_kill_trainer_step = S > 0 (tests): trainer rank rl_kill_trainer SIGKILLs itself as it
  // asks for the batch of its step S (disaggregated: the job stops naming it, docs/rl.md).
  int64_t kill_trainer = 0, kill_trainer_step = 0;
  // [fault] rl_kill_stagger = M (tests): rollout rank i (of rl.rollout_ranks) dies after
  // rl_kill_after_tokens + i * M tokens, so a test can kill a second rollout rank after the first.
  int64_t kill_stagger = 0;
  // [fault] rl_kill_shadow_step = S > 0 (tests): the shadow rank SIGKILLs itself once it has taken
  // the push of RL step S.
  int64_t kill_shadow_step = 0;
  uint64_t seed = 1;

  static RlConfig from_config(Config& c, uint64_t seed);
};

}  // namespace atl::rl
