// The token-level losses of policy-gradient RL for language models, as fused autograd ops over
// the logits (one pass forward, the gradient w.r.t. the logits written directly in backward):
//
//   policy loss (PPO, Schulman et al. 2017; GRPO, Shao et al. 2024):
//     r_i = exp(logp_i - old_i),  pg_i = -min(r_i A_i, clip(r_i, 1-lo, 1+hi) A_i)
//     kl_i = exp(ref_i - logp_i) - (ref_i - logp_i) - 1     (Schulman's k3 estimator of KL(pi||ref))
//     loss = sum_i w_i (pg_i + beta kl_i)
//   value loss (PPO's clipped value objective):
//     loss = sum_i w_i 0.5 max((v_i - R_i)^2, (old_i + clip(v_i - old_i, -c, c) - R_i)^2)   (c = 0: no clip)
//
// The per-token weights w_i carry the normalisation (per sequence, per token, constant: see
// advantages.h), so one op serves GRPO, Dr. GRPO, REINFORCE++ and PPO. Rows with w_i = 0 (prompt
// and padding) cost nothing and get zero gradient.
//
// token_logprobs is THE log-probability function: the rollout's scoring pass, the reference model
// and the trainer's loss all compute log pi(target | context) with it, from logits of the same
// forward on the same batch, so they agree bit for bit (the ratio is exactly 1 and the KL exactly 0
// at the first step).
#pragma once
#include "autograd/graph.h"

namespace atl::rl {

// logits [N,V] f32, targets [N] i32 -> [N] f32 log-probabilities (0 where target < 0). No graph.
Tensor token_logprobs(const Tensor& logits, const Tensor& targets);

struct PolicyLossConfig {
  float clip_low = 0.2f, clip_high = 0.2f;  // the ratio is clipped to [1 - low, 1 + high]
  float kl_coef = 0.0f;                     // beta of the k3 term
};

// Means over the rows with w_i != 0, for the log.
struct PolicyLossStats {
  double kl = 0, clip_frac = 0, ratio = 0, entropy = 0;
  int64_t tokens = 0;
};

// logits [N,V] (records a node when they need grad); the others [N], constant.
Tensor policy_loss(const Tensor& logits, const Tensor& targets, const Tensor& old_logp, const Tensor& ref_logp,
                   const Tensor& advantages, const Tensor& weights, const PolicyLossConfig& c,
                   PolicyLossStats* stats = nullptr);

// values [N] (records when it needs grad); old_values, returns, weights [N] constant.
Tensor value_loss(const Tensor& values, const Tensor& old_values, const Tensor& returns, const Tensor& weights,
                  float clip);

}  // namespace atl::rl
