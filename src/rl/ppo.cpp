// PPO's advantages: generalised advantage estimation over the value head's old values
// (Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE"): delta_t = r_t +
// gamma V_{t+1} - V_t (V = 0 after the last token), A_t = delta_t + gamma lambda A_{t+1}, returns
// R_t = A_t + V_t; the advantages are then whitened over the batch's tokens (algorithm.h).
//
// Multi-turn episodes (rl/multi_turn.h): the time steps are the model's own tokens only. A reply
// is the environment's transition: the step after a turn's end marker is the next turn's first
// model token (its state holds the reply), so delta and the gamma-lambda recursion skip the
// replies as if they were not there, t + 1 meaning the next model token. The replies' values are
// computed (one forward) but never read, and they get no advantage, no return and no weight (so no
// policy or value loss); the per-token KL penalty is on the model's tokens, the episode's reward on
// its last model token (an episode never ends on a reply).
#include "rl/algorithm.h"

namespace atl::rl {
namespace {
struct Reg {
  Reg() {
    algorithm_registry().add("ppo", {true, false, [](RolloutBatch& b, const AlgorithmConfig& c) {
                                       std::vector<double> r = token_rewards(b, c.kl_coef);
                                       const float* V = b.old_values.f32();
                                       for (int64_t row = 0; row < b.B; ++row) {
                                         const int64_t f = b.first[size_t(row)], n = b.count[size_t(row)];
                                         double next_v = 0, a = 0;
                                         for (int64_t t = f + n - 1; t >= f; --t) {
                                           const int64_t i = row * b.T + t;
                                           if (!is_action(b, i)) continue;
                                           const double delta = r[size_t(i)] + double(c.gamma) * next_v - V[i];
                                           a = delta + double(c.gamma) * double(c.lam) * a;
                                           b.advantages.f32()[i] = float(a);
                                           b.returns.f32()[i] = float(a + V[i]);
                                           next_v = V[i];
                                         }
                                       }
                                       whiten(b, b.advantages);
                                       token_mean_weights(b);
                                     }});
  }
} reg;
}  // namespace
}  // namespace atl::rl
