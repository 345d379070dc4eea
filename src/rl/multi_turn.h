// Multi-turn episodes (rl.turns > 1): the model answers, the environment replies to a wrong answer
// (VerifiableTask::feedback: "x=" wrong, try again; arithmetic's tool verdict "<=" / ">="), the
// model answers again with the whole exchange as its context, up to rl.turns answers. The reward is
// the final answer's (exact + format). The agentic multi-turn setting of "Performance Foundations
// of Parallel & Distributed Reasoning Language Models" and Belayer, on a verifiable task.
//
// An episode is one rollout row: prompt, then turn 1 + end marker + reply + turn 2 ... ; only the
// model's tokens are trained on: the replies' targets are masked (Sample::env, pack_rollouts), so
// the policy gradient, the KL and GRPO's length normaliser see the model's own tokens only, and
// PPO's GAE and REINFORCE++'s return-to-go step over them, a reply being the environment's
// transition between two of the model's steps (rl/ppo.cpp). With the disaggregated placement the
// rollout ranks run whole episodes and ship the masks with the tokens (encode_rollouts).
// Each turn is one batched generation over the episodes still going (row i of the turn's batch
// samples from Rng(seed ^ turn, i), as generate_batch does), so a batch is a function of the
// weights, the prompts and the seed.
#pragma once
#include <vector>

#include "nn/policy_model.h"
#include "rl/verifiable_task.h"

namespace atl::rl {

struct Episode {
  std::vector<int32_t> completion;  // every token after the prompt, the last end marker excluded
  std::vector<uint8_t> env;         // per completion token: 1 = the environment's reply
  std::string final_answer;         // the last turn's text
  bool stopped = false;             // the last turn ended with the end marker
  int64_t turns = 0;                // the model's turns
  bool first_exact = false;         // the first answer was already right
};

// Runs one episode per prompt row (rows[i] = encode(probs[i]->prompt)); each turn at most max_new
// tokens. An episode ends on a right answer, after `turns` answers, or on a turn that did not end
// (no end marker within max_new: nothing to reply to).
std::vector<Episode> run_episodes(const nn::PolicyModel& policy, const VerifiableTask& task,
                                  const std::vector<const Problem*>& probs, const std::vector<std::vector<int32_t>>& rows,
                                  const nn::SamplingConfig& s, int64_t max_new, int64_t turns);

// Positions an episode needs: the longest prompt, every turn and every reply.
int64_t episode_positions(const VerifiableTask& task, int64_t max_new, int64_t turns);

}  // namespace atl::rl
