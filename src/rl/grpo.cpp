// GRPO and Dr. GRPO advantages and loss weights (algorithm.h).
#include <cmath>

#include "core/error.h"
#include "rl/algorithm.h"

namespace atl::rl {

Registry<Algorithm>& algorithm_registry() {
  static Registry<Algorithm> r("rl algorithm");
  return r;
}

std::vector<float> group_advantages(const std::vector<double>& r, int64_t G, bool scale_by_std) {
  ATOLL_CHECK(G >= 1 && int64_t(r.size()) % G == 0, "rl: {} rewards are not whole groups of {}", r.size(), G);
  std::vector<float> a(r.size());
  for (size_t g0 = 0; g0 < r.size(); g0 += size_t(G)) {
    double mean = 0;
    for (int64_t j = 0; j < G; ++j) mean += r[g0 + size_t(j)];
    mean /= double(G);
    double var = 0;
    for (int64_t j = 0; j < G; ++j) var += (r[g0 + size_t(j)] - mean) * (r[g0 + size_t(j)] - mean);
    // torch.std's unbiased estimate, as GRPO implementations use; a group of one has no spread.
    const double sd = G > 1 ? std::sqrt(var / double(G - 1)) : 0.0;
    for (int64_t j = 0; j < G; ++j) {
      const double d = r[g0 + size_t(j)] - mean;
      a[g0 + size_t(j)] = float(scale_by_std ? d / (sd + 1e-4) : d);
    }
  }
  return a;
}

namespace {

std::vector<double> rewards_of(const RolloutBatch& b) {
  std::vector<double> r;
  for (const Sample& s : b.samples) r.push_back(s.reward.total);
  return r;
}

// Sequence advantage on each of its tokens; weight 1/(B * norm(b)). Only the model's own tokens:
// a multi-turn episode's environment replies have no target (rollout.h) and no weight.
void fill(RolloutBatch& b, const std::vector<float>& a, const std::function<double(int64_t)>& norm) {
  for (int64_t r = 0; r < b.B; ++r)
    for (int64_t t = b.first[size_t(r)]; t < b.first[size_t(r)] + b.count[size_t(r)]; ++t) {
      if (b.target.i32()[r * b.T + t] < 0) continue;
      b.advantages.f32()[r * b.T + t] = a[size_t(r)];
      b.weights.f32()[r * b.T + t] = float(1.0 / (double(b.B) * norm(r)));
    }
}

struct Reg {
  Reg() {
    algorithm_registry().add("grpo", {false, true, [](RolloutBatch& b, const AlgorithmConfig& c) {
                                        fill(b, group_advantages(rewards_of(b), c.group_size, true),
                                             [&](int64_t r) { return double(std::max<int64_t>(1, b.own[size_t(r)])); });
                                      }});
    algorithm_registry().add("dr_grpo", {false, true, [](RolloutBatch& b, const AlgorithmConfig& c) {
                                           // +1: the end marker is a generated token too; a
                                           // multi-turn episode's budget is every turn's.
                                           const double L = double(c.turns * (c.max_new_tokens + 1));
                                           fill(b, group_advantages(rewards_of(b), c.group_size, false),
                                                [L](int64_t) { return L; });
                                         }});
  }
} reg;

}  // namespace
}  // namespace atl::rl
