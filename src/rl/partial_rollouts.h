// Partial rollouts carried across updates (rl.partial_tokens > 0; the "partial rollouts" of Kimi
// k1.5, Kimi Team 2025): generation runs in rounds of at most partial_tokens new tokens per
// sequence; a generation cut by the round is kept and continued in a later round, after the next
// weight update when the step's batch is already full. So a long completion no longer holds the
// whole batch back, and its prefix is reused, not regenerated.
//
// One step, with the generating weights at version v:
//   repeat: start rl.prompts new groups (rl.group_size rollouts of one prompt); continue every
//           unfinished rollout by <= partial_tokens tokens (the KV cache is rebuilt from its prefix,
//           as Belayer's shadow does); score the new tokens' log-probs under v
//   until at least rl.prompts groups are complete; the batch is every complete group (oldest first),
//   the others are carried to the next step.
// A rollout ends at the end marker or after max_new tokens, so a group completes at most
// R = ceil(max_new / partial_tokens) rounds after it started and each step runs at least one round:
// no token is more than R - 1 updates older than the generating weights (plus the placement's own
// lag), which the engine checks against the batch's staleness.
//
// Versions and importance: every token keeps the version that sampled it and its log-prob under
// that version, the behaviour policy's. The batch's old_logp holds exactly that: for tokens of
// version v it is the scoring pass over the final [B,T] batch (bitwise what the trainer recomputes
// at v: ratio exactly 1), for older tokens the value scored when they were sampled. The clipped
// ratio pi_theta / pi_behaviour(token) is then the per-token importance correction, as in async; a
// sample's policy_version is its oldest token's (the staleness), gen_version its newest.
// Journal (rl.journal_dir, Belayer): each round may be generated through a caller's function (the
// engine journals it with RolloutWorker::run_batched, the same calls as generate_batch, so the
// tokens are the unjournaled ones bit for bit); a rollout's requests are named uid * group_size + k
// in every round of every step, so a rollout carried across updates keeps one journal id and its
// lines over the rounds concatenate to its completion.
// Checkpoints: the carried groups (every token, behaviour log-prob bit and version) and the uid
// counter are saved as int32 words (save/load), so a resumed run continues them bit for bit.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "nn/model.h"
#include "nn/policy_model.h"
#include "rl/rollout.h"
#include "rl/verifiable_task.h"

namespace atl::rl {

struct PartialRolloutConfig {
  int64_t prompts = 8, group_size = 8, max_new = 8, partial_tokens = 0;
  float temperature = 1.0f, format_reward = 0.1f;
  int64_t top_k = 0;
};

class PartialRollouts {
 public:
  PartialRollouts(PartialRolloutConfig c, const VerifiableTask& task) : c_(c), task_(task) {}
  // Rounds until rl.prompts groups are complete, with `gen` at `version`; prompts from `draw`,
  // sampling streams from `seed`. The batch's old_logp is the behaviour log-probs (see above).
  // round_gen: generates one round instead of generate_batch (rows: each live rollout's prompt +
  // completion so far; ids: their journal ids; s: the round's sampling, s.seed its stream).
  using RoundGen = std::function<std::vector<nn::PolicyModel::Completion>(
      const std::vector<std::vector<int32_t>>& rows, const std::vector<int64_t>& ids, const nn::SamplingConfig& s,
      int64_t round)>;
  RolloutBatch step(const nn::Model& gen, int64_t version, Rng& draw, uint64_t seed, const RoundGen& round_gen = {});
  // Groups carried (unfinished) into the next step.
  int64_t carried_groups() const { return int64_t(pool_.size()); }
  int64_t rounds_per_group() const { return (c_.max_new + c_.partial_tokens - 1) / c_.partial_tokens; }
  // The carried state as int32 words, and back (replacing this pool; malformed words are an error
  // naming `what`).
  std::vector<int32_t> save() const;
  void load(const std::vector<int32_t>& words, const std::string& what);

 private:
  struct Seq {
    std::vector<int32_t> prompt, completion;
    std::vector<float> logp;        // behaviour log-prob of each completion token (+ the end marker)
    std::vector<int64_t> version;   // the version that sampled it
    bool done = false, stopped = false;
  };
  struct Group {
    Problem problem;
    std::vector<Seq> seqs;
    int64_t uid = 0;
    bool complete() const;
  };
  PartialRolloutConfig c_;
  const VerifiableTask& task_;
  std::deque<Group> pool_;
  int64_t next_uid_ = 0;
};

}  // namespace atl::rl
