// Partial rollouts carried across updates (rl/partial_rollouts.h): with rounds of 2 tokens and
// completions of up to 6, generations are cut and continued after the next updates; each token
// keeps the version that sampled it and its behaviour log-prob under that version; the current
// version's tokens carry exactly the trainer's recomputed log-prob (ratio 1), older ones the old
// weights' (ratio != 1: the importance correction); no group is trained on twice, none is split,
// and the staleness stays within its bound (ceil(6/2) - 1 = 2 updates).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "autograd/graph.h"
#include "nn/model.h"
#include "rl/rl_engine.h"
#include "tiny_model.h"

namespace atl::rl {
namespace {

using rltest::kTinyModel;

std::unique_ptr<nn::Model> copy_of(const nn::Model& m) {
  auto c = nn::model_from_metadata(m.config_metadata());
  Tensor d = c->flat_values();
  d.copy_from(m.flat_values());
  return c;
}

TEST(RlPartialRollouts, CarriedAcrossUpdatesWithTheirVersionsLogProbs) {
  Config cfg = Config::parse(std::string(kTinyModel) + "\n[rl]\nprompts = 2\ngroup_size = 2\nmax_new_tokens = 6\n"
                                                   "partial_tokens = 2\nkl_coef = 0.1\n",
                             "test");
  RlEngine eng(RlConfig::from_config(cfg, 7));
  Config mc = Config::parse(kTinyModel, "model");
  auto m = nn::make_model(mc, "model");
  m->init_weights(11);
  eng.setup(*m, nullptr, 0, 1);
  std::map<int64_t, std::unique_ptr<nn::Model>> snapshot;
  std::set<int64_t> seen;
  int64_t mixed = 0, max_staleness = 0;
  for (int64_t k = 0; k < 6; ++k) {
    snapshot[k] = copy_of(*m);
    const RolloutBatch& b = eng.next_batch();
    ASSERT_GE(b.B, 4) << "at least rl.prompts complete groups";
    ASSERT_EQ(b.gen_version, k);
    std::map<int64_t, int> per_group;
    for (const Sample& s : b.samples) ++per_group[s.uid];
    for (auto [uid, n] : per_group) {
      EXPECT_EQ(n, 2) << "group " << uid << " split between batches";
      EXPECT_TRUE(seen.insert(uid).second) << "group " << uid << " trained on twice";
    }
    const Tensor now = RlEngine::score_logprobs(*m, b);  // the trainer's recomputation at version k
    bool old_differs = false;
    int64_t oldest = k;
    for (int64_t r = 0; r < b.B; ++r) {
      const Sample& s = b.samples[size_t(r)];
      ASSERT_EQ(int64_t(s.token_version.size()), b.count[size_t(r)]) << "step " << k << " row " << r;
      ASSERT_TRUE(std::is_sorted(s.token_version.begin(), s.token_version.end()));
      if (s.token_version.front() != s.token_version.back()) ++mixed;
      for (size_t j = 0; j < s.token_version.size(); ++j) {
        const int64_t u = s.token_version[j], at = r * b.T + b.first[size_t(r)] + int64_t(j);
        oldest = std::min(oldest, u);
        ASSERT_GE(u, k - 2);
        ASSERT_LE(u, k);
        const float have = b.old_logp.f32()[at];
        if (u == k) {
          EXPECT_EQ(std::memcmp(&have, now.f32() + at, 4), 0) << "step " << k << " row " << r << " token " << j;
          continue;
        }
        // A carried token: its log-prob under the version that sampled it. Scored then in another
        // batch shape (rows, padding), so equal to this re-scoring up to fp32 summation order
        // (~1e-6 relative on values of magnitude ~5): 1e-4.
        const Tensor then = RlEngine::score_logprobs(*snapshot[u], b);
        EXPECT_NEAR(have, then.f32()[at], 1e-4) << "step " << k << " row " << r << " token " << j << " version " << u;
        if (std::fabs(have - now.f32()[at]) > 1e-3) old_differs = true;
      }
    }
    EXPECT_EQ(b.policy_version, oldest);
    Tensor loss = eng.loss(*m, b);
    clear_tape();
    nlohmann::json mt = eng.step_metrics();
    EXPECT_EQ(mt.at("staleness").get<int64_t>(), k - oldest);
    max_staleness = std::max(max_staleness, k - oldest);
    if (oldest < k) {
      EXPECT_TRUE(old_differs) << "step " << k << ": carried tokens' log-probs equal the new weights'";
      EXPECT_GT(mt.at("partial_samples").get<int64_t>(), 0);
      EXPECT_NE(mt.at("ratio").get<double>(), 1.0);
    } else {
      EXPECT_EQ(mt.at("ratio").get<double>(), 1.0);
    }
    Tensor w = m->flat_values();  // an update
    for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] += 0.02f * float(std::sin(double(i) * 0.37 + double(k)));
  }
  EXPECT_GT(mixed, 0) << "no generation was carried across an update";
  EXPECT_EQ(max_staleness, 2);
}

TEST(RlPartialRollouts, AsyncIsRefusedNamingTheKey) {
  Config cfg = Config::parse(std::string(kTinyModel) + "\n[rl]\nplacement = \"async\"\npartial_tokens = 2\n", "test");
  try {
    RlConfig::from_config(cfg, 1);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rl.partial_tokens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atl::rl
