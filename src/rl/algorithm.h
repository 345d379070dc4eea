// RL algorithms as named advantage estimators over a scored rollout batch ([rl] algorithm):
//   grpo          group-relative advantages (r - mean_g) / (std_g + 1e-4), each sequence's tokens
//                 averaged, k3 KL to the reference in the loss (Shao et al. 2024, DeepSeekMath)
//   dr_grpo       GRPO without the std division and with a constant length normaliser
//                 (max_new_tokens) instead of each sequence's own length (Liu et al. 2025,
//                 "Understanding R1-Zero-Like Training", Dr. GRPO)
//   reinforce_pp  REINFORCE++ (Hu 2025): no critic and no group baseline; per-token reward is the
//                 k1 KL penalty -beta (old - ref) plus the sequence reward at the last token, the
//                 return-to-go whitened over the batch's tokens, token-mean loss
//   ppo           PPO with a value head and GAE (Schulman et al. 2016, 2017), the same per-token
//                 rewards, whitened advantages, clipped value loss
// Each fills the batch's advantages and loss weights (and returns for ppo); the loss itself is
// rl/policy_loss.h's.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/registry.h"
#include "rl/rollout.h"

namespace atl::rl {

struct AlgorithmConfig {
  float kl_coef = 0.04f;
  float gamma = 1.0f, lam = 0.95f;  // GAE (ppo)
  int64_t max_new_tokens = 8;       // Dr. GRPO's constant normaliser
  int64_t group_size = 8;
  int64_t turns = 1;                // multi-turn episodes: Dr. GRPO's normaliser covers every turn
};

struct Algorithm {
  bool value_head = false;  // needs old_values filled before prepare (ppo)
  bool kl_in_loss = true;   // false: the KL penalty is in the reward, the loss has none
  std::function<void(RolloutBatch&, const AlgorithmConfig&)> prepare;
};
Registry<Algorithm>& algorithm_registry();

// Pieces, exposed for the tests against the PyTorch reference.
// Position i ([B*T]) is one of the model's actions: it has a target (a completion token or the end
// marker the model sampled). False for the prompt, the padding and a multi-turn episode's replies.
inline bool is_action(const RolloutBatch& b, int64_t i) { return b.target.i32()[i] >= 0; }
// Sequence-level group advantages: rewards of consecutive groups of group_size.
std::vector<float> group_advantages(const std::vector<double>& rewards, int64_t group_size, bool scale_by_std);
// Per-token rewards of the KL-penalised objective: -beta (old - ref) at each of the model's tokens
// and the sequence reward added at its last one; zero elsewhere (replies included). [B*T]
std::vector<double> token_rewards(const RolloutBatch& b, float kl_coef);
// In place over the model's tokens: (x - mean) / sqrt(var + 1e-8), population variance.
void whiten(RolloutBatch& b, Tensor& x);
// 1/(the model's tokens in the batch) on each of them.
void token_mean_weights(RolloutBatch& b);

}  // namespace atl::rl
