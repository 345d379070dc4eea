#include "rl/rl_config.h"

#include "core/error.h"

namespace atl::rl {

RlConfig RlConfig::from_config(Config& c, uint64_t seed) {
  RlConfig r;
  r.seed = seed;
  r.algorithm = c.get_string("rl.algorithm", r.algorithm, algorithm_registry().names());
  r.task.name = c.get_string("rl.task", r.task.name, verifiable_task_registry().names());
  r.task.digits = c.get_int("rl.digits", r.task.digits, 1, 6);
  r.task.word_min = c.get_int("rl.word_min", r.task.word_min, 1, 16);
  r.task.word_max = c.get_int("rl.word_max", r.task.word_max, 1, 16);
  r.task.words_file = c.get_string("rl.words_file", r.task.words_file);
  r.heldout_percent = int(c.get_int("rl.heldout_percent", r.heldout_percent, 1, 50));
  r.prompts = c.get_int("rl.prompts", r.prompts, 1, 4096);
  r.group_size = c.get_int("rl.group_size", r.group_size, 1, 256);
  r.max_new_tokens = c.get_int("rl.max_new_tokens", r.max_new_tokens, 0, 1024);
  r.temperature = float(c.get_float("rl.temperature", r.temperature, 0.0, 10.0));
  r.top_k = c.get_int("rl.top_k", r.top_k, 0, 1 << 20);
  r.loss.clip_low = float(c.get_float("rl.clip_low", r.loss.clip_low, 0.0, 0.999));
  r.loss.clip_high = float(c.get_float("rl.clip_high", r.loss.clip_high, 0.0, 10.0));
  r.alg.kl_coef = float(c.get_float("rl.kl_coef", r.alg.kl_coef, 0.0, 10.0));
  r.alg.gamma = float(c.get_float("rl.gamma", r.alg.gamma, 0.0, 1.0));
  r.alg.lam = float(c.get_float("rl.lam", r.alg.lam, 0.0, 1.0));
  r.epochs = c.get_int("rl.epochs", r.epochs, 1, 64);
  r.vf_coef = float(c.get_float("rl.vf_coef", r.vf_coef, 0.0, 100.0));
  r.value_clip = float(c.get_float("rl.value_clip", r.value_clip, 0.0, 100.0));
  r.value_lr = float(c.get_float("rl.value_lr", r.value_lr, 0.0, 1.0));
  r.sft_steps = c.get_int("rl.sft_steps", r.sft_steps, 0, int64_t(1) << 40);
  r.sft_batch = c.get_int("rl.sft_batch", r.sft_batch, 1, 65536);
  r.format_reward = float(c.get_float("rl.format_reward", r.format_reward, 0.0, 1.0));
  r.lr_scale = float(c.get_float("rl.lr_scale", r.lr_scale, 0.0, 100.0));
  r.eval_size = c.get_int("rl.eval_size", r.eval_size, 1, 100000);
  r.eval_samples = c.get_int("rl.eval_samples", r.eval_samples, 0, 256);
  r.placement = c.get_string("rl.placement", r.placement, {"colocated", "async", "disaggregated"});
  r.max_staleness = c.get_int("rl.max_staleness", r.max_staleness, 0, 1);
  r.rollout_ranks = c.get_int("rl.rollout_ranks", r.rollout_ranks, 1, 4096);
  r.partial_tokens = c.get_int("rl.partial_tokens", r.partial_tokens, 0, 1024);
  ATOLL_CHECK(r.partial_tokens == 0 || r.placement != "async",
              "rl.partial_tokens ({}) is for rl.placement 'colocated' or 'disaggregated', not 'async'",
              c.where("rl.partial_tokens"));
  r.sync_bucket_mb = c.get_float("rl.sync_bucket_mb", r.sync_bucket_mb, 1e-3, 1024.0);
  r.journal_dir = c.get_string("rl.journal_dir", r.journal_dir);
  // With partial rollouts (rl.partial_tokens > 0) each round is journaled as a batch and the carried
  // pool written beside the journals (rl/partial_journal.cpp).
  // Batched journal decoding (RolloutWorker::run_batched): the same tokens as without a journal.
  r.journal_batched = c.get_bool("rl.journal_batched", r.journal_batched);
  ATOLL_CHECK(!r.journal_batched || !r.journal_dir.empty(), "rl.journal_batched ({}) needs rl.journal_dir",
              c.where("rl.journal_batched"));
  // Fault injection (tests): the process generating journaled rollouts raises SIGKILL after this
  // many newly sampled tokens, mid-trajectory; a restarted or shadow process continues the journal.
  r.kill_after_tokens = c.get_int("fault.rl_kill_after_tokens", 0, 0, int64_t(1) << 40);
  ATOLL_CHECK(r.kill_after_tokens == 0 || !r.journal_dir.empty(),
              "fault.rl_kill_after_tokens ({}) needs rl.journal_dir: only journaled rollouts can be taken over",
              c.where("fault.rl_kill_after_tokens"));
  r.kill_stagger = c.get_int("fault.rl_kill_stagger", 0, 0, int64_t(1) << 40);
  ATOLL_CHECK(r.kill_stagger == 0 || r.kill_after_tokens > 0, "fault.rl_kill_stagger ({}) needs "
              "fault.rl_kill_after_tokens: the first rollout rank's death", c.where("fault.rl_kill_stagger"));
  r.kill_shadow_step = c.get_int("fault.rl_kill_shadow_step", 0, 0, int64_t(1) << 40);
  r.kill_trainer = c.get_int("fault.rl_kill_trainer", 0, 0, 4095);
  r.kill_trainer_step = c.get_int("fault.rl_kill_trainer_step", 0, 0, int64_t(1) << 40);
  ATOLL_CHECK(r.kill_trainer == 0 || r.kill_trainer_step > 0, "fault.rl_kill_trainer ({}) needs "
              "fault.rl_kill_trainer_step: the step at which that trainer dies", c.where("fault.rl_kill_trainer"));
  // Belayer's live takeover (rl/shadow_rank.h): the job's last rank follows the pushes and continues
  // a dead rollout rank's journal inside the running job.
  r.shadow_ranks = c.get_int("rl.shadow_ranks", r.shadow_ranks, 0, 1);
  ATOLL_CHECK(r.kill_shadow_step == 0 || r.shadow_ranks == 1, "fault.rl_kill_shadow_step ({}) needs rl.shadow_ranks "
              "= 1: there is no shadow rank to kill", c.where("fault.rl_kill_shadow_step"));
  ATOLL_CHECK(r.shadow_ranks == 0 || (r.placement == "disaggregated" && !r.journal_dir.empty()),
              "rl.shadow_ranks ({}) needs rl.placement = 'disaggregated' and rl.journal_dir: the shadow continues a "
              "rollout rank's journal", c.where("rl.shadow_ranks"));
  ATOLL_CHECK(r.task.word_min <= r.task.word_max, "rl.word_min ({}) must not exceed rl.word_max ({})", r.task.word_min,
              r.task.word_max);
  if (r.algorithm == "grpo" || r.algorithm == "dr_grpo")
    ATOLL_CHECK(r.group_size >= 2, "rl.group_size ({}) must be at least 2 for {}: its baseline is the group's mean",
                c.where("rl.group_size"), r.algorithm);
  if (r.placement == "async")
    ATOLL_CHECK(r.max_staleness == 1, "rl.max_staleness ({}) must be 1 for rl.placement = 'async' (one step off-policy)",
                c.where("rl.max_staleness"));
  if (r.placement == "async")
    ATOLL_CHECK(r.epochs == 1, "rl.epochs ({}) must be 1 for rl.placement = 'async': a batch reused for more updates "
                "would be more than one step stale", c.where("rl.epochs"));
  // Multi-turn episodes (rl/multi_turn.h): every algorithm sees the model's own tokens only (PPO's
  // GAE steps over them, rl/ppo.cpp); the disaggregated payload carries the reply masks. The
  // generation paths that know single turns only (journaled, partial) refuse it.
  r.turns = c.get_int("rl.turns", r.turns, 1, 8);
  if (r.turns > 1)
    ATOLL_CHECK(r.partial_tokens == 0 && r.journal_dir.empty(),
                "rl.turns ({}) is for generation without rl.partial_tokens or rl.journal_dir", c.where("rl.turns"));
  r.alg.turns = r.turns;
  r.alg.group_size = r.group_size;
  if (algorithm_registry().get(r.algorithm).kl_in_loss) r.loss.kl_coef = r.alg.kl_coef;
  return r;
}

}  // namespace atl::rl
