// A batch of rollouts as the trainer consumes it: each sequence prompt + completion (+ the end
// marker when the row stopped) as one row, input = tokens[0..n-2], target = tokens[1..n-1] with
// the prompt's targets masked (-1), right-padded with 0 to the longest row. Per-token tensors
// ([B*T], row-major) hold what the algorithms attach: the behaviour policy's and the reference's
// log-probs, old values, advantages, returns and the loss weights.
#pragma once
#include <cstdint>
#include <vector>

#include "rl/verifiable_task.h"
#include "tensor/tensor.h"

namespace atl::rl {

struct Sample {
  Problem problem;
  std::vector<int32_t> prompt, completion;  // completion without the end marker
  bool stopped = false;
  Reward reward;
  int64_t group = 0;  // samples of one prompt share a group (GRPO's baseline)
  // Partial rollouts (rl/partial_rollouts.h): the version that sampled each completion token (+ the
  // end marker), and the group's id over the run. Empty / 0 otherwise (every token the batch's).
  std::vector<int64_t> token_version;
  int64_t uid = 0;
  // Multi-turn episodes (rl/multi_turn.h): 1 for each completion token the environment wrote (its
  // replies), 0 for the model's; empty: every token is the model's. The environment's tokens are
  // context, not actions: their targets are masked out of the loss (pack_rollouts).
  std::vector<uint8_t> env;
  int64_t turns = 1;  // the model's turns in the episode
};

struct RolloutBatch {
  int64_t B = 0, T = 0;
  std::vector<Sample> samples;
  Tensor input, target;                    // [B,T] i32
  std::vector<int64_t> first, count;       // row b's completion targets: positions first..first+count-1
  std::vector<int64_t> own;                // of those, the model's own tokens (= count without env replies)
  Tensor old_logp, ref_logp, old_values;   // [B*T] f32
  Tensor advantages, returns, weights;     // [B*T] f32
  int64_t policy_version = 0;              // updates the generating weights had seen (the oldest token's)
  int64_t gen_version = -1;                // partial rollouts: the newest token's (-1: policy_version)
  double gen_s = 0, score_s = 0;           // time spent generating and scoring it
  int64_t gen_tokens = 0;                  // tokens sampled (completions, end markers included)
  // Partial rollouts, disaggregated: the stream's carried pool after this batch (PartialRollouts::save
  // words), sent with the batch so that the trainers can checkpoint it. Empty otherwise.
  std::vector<int32_t> carried;
  int64_t tokens() const;                  // completion tokens (targets) in the batch
};

RolloutBatch pack_rollouts(std::vector<Sample> samples);

}  // namespace atl::rl
