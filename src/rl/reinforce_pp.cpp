// REINFORCE++ (Hu 2025): critic-free, KL-penalised per-token rewards, return-to-go whitened over
// the whole batch (not per group), token-mean loss (algorithm.h). Also the shared per-token
// reward and whitening helpers PPO uses. All of them see the model's own tokens only: a
// multi-turn episode's replies (no target, rollout.h) get no reward, no advantage and no weight,
// and are left out of the whitening's mean and variance.
#include <cmath>

#include "rl/algorithm.h"

namespace atl::rl {

std::vector<double> token_rewards(const RolloutBatch& b, float kl_coef) {
  std::vector<double> r(size_t(b.B * b.T), 0.0);
  for (int64_t row = 0; row < b.B; ++row) {
    const int64_t f = b.first[size_t(row)], n = b.count[size_t(row)];
    int64_t last = -1;  // the model's last token: an episode never ends on a reply
    for (int64_t t = f; t < f + n; ++t) {
      const int64_t i = row * b.T + t;
      if (!is_action(b, i)) continue;
      r[size_t(i)] = -double(kl_coef) * (double(b.old_logp.f32()[i]) - double(b.ref_logp.f32()[i]));
      last = i;
    }
    if (last >= 0) r[size_t(last)] += b.samples[size_t(row)].reward.total;
  }
  return r;
}

void whiten(RolloutBatch& b, Tensor& x) {
  double s = 0, n = 0;
  for (int64_t row = 0; row < b.B; ++row)
    for (int64_t t = b.first[size_t(row)]; t < b.first[size_t(row)] + b.count[size_t(row)]; ++t)
      if (is_action(b, row * b.T + t)) s += x.f32()[row * b.T + t], ++n;
  if (n == 0) return;
  const double mean = s / n;
  double v = 0;
  for (int64_t row = 0; row < b.B; ++row)
    for (int64_t t = b.first[size_t(row)]; t < b.first[size_t(row)] + b.count[size_t(row)]; ++t) {
      if (!is_action(b, row * b.T + t)) continue;
      const double d = x.f32()[row * b.T + t] - mean;
      v += d * d;
    }
  const double inv = 1.0 / std::sqrt(v / n + 1e-8);
  for (int64_t row = 0; row < b.B; ++row)
    for (int64_t t = b.first[size_t(row)]; t < b.first[size_t(row)] + b.count[size_t(row)]; ++t) {
      if (!is_action(b, row * b.T + t)) continue;
      float& e = x.f32()[row * b.T + t];
      e = float((double(e) - mean) * inv);
    }
}

void token_mean_weights(RolloutBatch& b) {
  int64_t own = 0;
  for (int64_t row = 0; row < b.B; ++row)
    for (int64_t t = b.first[size_t(row)]; t < b.first[size_t(row)] + b.count[size_t(row)]; ++t)
      own += is_action(b, row * b.T + t) ? 1 : 0;
  const double inv = 1.0 / double(std::max<int64_t>(1, own));
  for (int64_t row = 0; row < b.B; ++row)
    for (int64_t t = b.first[size_t(row)]; t < b.first[size_t(row)] + b.count[size_t(row)]; ++t)
      if (is_action(b, row * b.T + t)) b.weights.f32()[row * b.T + t] = float(inv);
}

namespace {
struct Reg {
  Reg() {
    algorithm_registry().add("reinforce_pp", {false, false, [](RolloutBatch& b, const AlgorithmConfig& c) {
                                                std::vector<double> r = token_rewards(b, c.kl_coef);
                                                for (int64_t row = 0; row < b.B; ++row) {
                                                  double g = 0;
                                                  const int64_t f = b.first[size_t(row)], n = b.count[size_t(row)];
                                                  for (int64_t t = f + n - 1; t >= f; --t) {
                                                    // A reply is the environment's, not a step: the
                                                    // return crosses it undiscounted (as PPO's GAE).
                                                    if (!is_action(b, row * b.T + t)) continue;
                                                    g = r[size_t(row * b.T + t)] + double(c.gamma) * g;
                                                    b.advantages.f32()[row * b.T + t] = float(g);
                                                  }
                                                }
                                                whiten(b, b.advantages);
                                                token_mean_weights(b);
                                              }});
  }
} reg;
}  // namespace

}  // namespace atl::rl
