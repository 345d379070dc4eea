// GRPO, Dr. GRPO, REINFORCE++ and PPO on one fixed batch against PyTorch 1.13 (tools/rl_loss_ref.py,
// float64 autograd, written from the formulas independently of the C++): the advantages each
// algorithm derives from the rewards (and PPO's from the old values), the loss, its gradient with
// respect to the logits, and PPO's clipped value loss with its gradient w.r.t. the values.
// The same on a second batch whose rows hold multi-turn episodes' replies (Sample::env, session 11):
// positions with no target inside a completion, holding junk behaviour/reference log-probs and old
// values. The reference knows nothing of replies: it works on the mask of positions with a target,
// stepping its GAE and return-to-go over the masked ones, so the C++ must leave the replies out of
// the rewards, the time steps, the whitening's statistics and the token-mean normaliser.
//
// Tolerance: relative L2 1e-5. atoll computes log-softmax and the loss sums in double and stores
// fp32 (unit roundoff 6e-8); advantages, weights and log-probs pass through fp32 once or twice,
// so errors are of order 1e-7 on any x86-64 CPU whatever its FMA or vector width. The batch keeps
// every ratio and value change at least 0.01 away from the clip boundaries so that no rounding
// can flip a branch; any wrong sign, normaliser, index or branch is off by far more than 1e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <filesystem>
#include <unistd.h>

#include "autograd/graph.h"
#include "rl/algorithm.h"
#include "rl/policy_loss.h"
#include "tensor/safetensors.h"

namespace atl::rl {
namespace {

constexpr int64_t kGroup = 3, kV = 13, kMaxNew = 4;
constexpr float kLo = 0.2f, kHi = 0.28f, kBeta = 0.05f, kGamma = 0.9f, kLam = 0.8f, kVClip = 0.2f, kVf = 0.5f;

double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  EXPECT_EQ(a.numel(), b.numel());
  for (int64_t i = 0; i < a.numel() && i < b.numel(); ++i) {
    const double d = double(a.f32()[i]) - double(b.f32()[i]);
    num += d * d;
    den += double(b.f32()[i]) * double(b.f32()[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Moves x at least 0.01 away from each boundary.
float away(float x, std::initializer_list<float> bounds) {
  for (float b : bounds)
    if (std::fabs(x - b) < 0.01f) x = b + (x < b ? -0.02f : 0.02f);
  return x;
}

struct Fixture {
  RolloutBatch base;
  Tensor logits, values;

  // replies: rows 0, 2 and 4 are two- or three-turn episodes (their `env` marks the replies).
  explicit Fixture(bool replies) {
    Rng rng(2024, 3);
    std::vector<Sample> s;
    const int plen[6] = {2, 3, 4, 2, 3, 2}, clen[6] = {3, 1, 4, 2, 4, 3};
    const bool stop[6] = {true, false, true, true, false, true};
    const char* env[6] = {"0110", "", "0011000", "", "01100110", ""};  // replies: 1 = the environment's
    for (int i = 0; i < 6; ++i) {
      Sample x;
      const int n = replies && env[i][0] ? int(std::strlen(env[i])) : clen[i];
      for (int t = 0; t < plen[i]; ++t) x.prompt.push_back(int32_t(1 + rng.below(kV - 1)));
      for (int t = 0; t < n; ++t) x.completion.push_back(int32_t(1 + rng.below(kV - 1)));
      if (replies && env[i][0])
        for (int t = 0; t < n; ++t) x.env.push_back(uint8_t(env[i][t] - '0'));
      x.stopped = stop[i];
      x.reward.total = double(rng.below(3)) * 0.5 + (i == 4 ? 0.1 : 0.0);
      x.group = i / kGroup;
      s.push_back(x);
    }
    base = pack_rollouts(s);
    const int64_t N = base.B * base.T;
    logits = Tensor::empty({base.B, base.T, kV});
    rng.fill_normal(logits, 0.f, 2.f);
    Tensor lp = token_logprobs(logits, base.target);
    values = Tensor::zeros({N});
    for (int64_t i = 0; i < N; ++i) {
      if (base.target.i32()[i] < 0) {  // junk where a reply (or the prompt) is: it must not be read
        if (replies) {
          base.old_logp.f32()[i] = -3.0f * rng.uniform();
          base.ref_logp.f32()[i] = -3.0f * rng.uniform();
          base.old_values.f32()[i] = 5.0f * rng.normal();
          values.f32()[i] = 5.0f * rng.normal();
        }
        continue;
      }
      // ratio = exp(logp - old) kept away from 1 - lo and 1 + hi
      const float lr = away(1.2f * (rng.uniform() - 0.5f), {std::log(1 - kLo), std::log(1 + kHi)});
      base.old_logp.f32()[i] = lp.f32()[i] - lr;
      base.ref_logp.f32()[i] = lp.f32()[i] + 0.6f * (rng.uniform() - 0.5f);
      base.old_values.f32()[i] = rng.normal();
      values.f32()[i] = base.old_values.f32()[i] + away(rng.uniform() - 0.5f, {-kVClip, kVClip});
    }
  }

  RolloutBatch copy() const {
    RolloutBatch b = base;
    for (Tensor* t : {&b.old_logp, &b.ref_logp, &b.old_values, &b.advantages, &b.returns, &b.weights}) *t = t->clone();
    return b;
  }
};

// One batch and its PyTorch reference (built once per batch kind).
struct Reference {
  std::unique_ptr<Fixture> fx;
  std::unique_ptr<TensorFile> ref;
  std::string error;

  explicit Reference(bool replies) : fx(std::make_unique<Fixture>(replies)) {
    const RolloutBatch& b = fx->base;
    std::vector<float> rewards;
    for (auto& s : b.samples) rewards.push_back(float(s.reward.total));
    std::vector<std::pair<std::string, Tensor>> in = {
        {"logits", fx->logits},
        {"targets", b.target},
        {"old", b.old_logp.view({b.B, b.T})},
        {"ref", b.ref_logp.view({b.B, b.T})},
        {"rewards", Tensor::from_vector(rewards, {b.B})},
        {"old_values", b.old_values.view({b.B, b.T})},
        {"values", fx->values.view({b.B, b.T})}};
    std::map<std::string, std::string> meta = {
        {"group", std::to_string(kGroup)}, {"clip_low", std::to_string(kLo)},  {"clip_high", std::to_string(kHi)},
        {"kl_coef", std::to_string(kBeta)}, {"gamma", std::to_string(kGamma)}, {"lam", std::to_string(kLam)},
        {"max_new", std::to_string(kMaxNew)}, {"value_clip", std::to_string(kVClip)}, {"vf_coef", std::to_string(kVf)}};
    const auto dir = std::filesystem::temp_directory_path() /
                     ("atoll_rl_ref_" + std::to_string(getpid()) + (replies ? "_replies" : ""));
    std::filesystem::create_directories(dir);
    const auto fin = (dir / "in.safetensors").string(), fout = (dir / "out.safetensors").string();
    save_safetensors(fin, in, meta);
    const std::string cmd =
        std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR + "/tools/rl_loss_ref.py " + fin + " " + fout;
    const int rc = std::system(cmd.c_str());
    if (rc != 0) error = "'" + cmd + "' failed with status " + std::to_string(rc);
    else ref = std::make_unique<TensorFile>(load_safetensors(fout));
    std::filesystem::remove_all(dir);
  }

  Tensor get(const std::string& name) const {
    const Tensor* t = ref->find(name);
    EXPECT_TRUE(t) << name;
    return t ? *t : Tensor::zeros({1});
  }
};

class RlLossesTorch : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { refs.clear(); }

  static Reference& reference(bool replies) {
    auto& r = refs[replies];
    if (!r) r = std::make_unique<Reference>(replies);
    return *r;
  }

  // Runs one algorithm's advantages, loss and backward; compares with the reference.
  void check(const std::string& alg, bool replies = false) {
    const Reference& R = reference(replies);
    ASSERT_TRUE(R.ref) << "PyTorch reference unavailable: " << R.error;
    const Fixture* fx = R.fx.get();
    RolloutBatch b = fx->copy();
    AlgorithmConfig c;
    c.kl_coef = kBeta;
    c.gamma = kGamma;
    c.lam = kLam;
    c.max_new_tokens = kMaxNew;
    c.group_size = kGroup;
    const Algorithm& a = algorithm_registry().get(alg);
    a.prepare(b, c);
    Tensor lg = fx->logits.clone();
    set_requires_grad(lg, true, "logits");
    PolicyLossConfig pc{kLo, kHi, a.kl_in_loss ? kBeta : 0.0f};
    Tensor loss = policy_loss(lg, b.target, b.old_logp, b.ref_logp, b.advantages, b.weights, pc);
    backward(loss);
    EXPECT_LT(rel_l2(loss, R.get(alg + ".loss")), 1e-5) << alg << ": loss " << loss.item() << " vs "
                                                        << R.get(alg + ".loss").item();
    EXPECT_LT(rel_l2(grad_of(lg), R.get(alg + ".dlogits")), 1e-5) << alg << ": dL/dlogits";
    if (alg == "ppo") {
      Tensor v = fx->values.clone();
      set_requires_grad(v, true, "values");
      Tensor w = b.weights.clone();
      for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] *= kVf;
      Tensor vl = value_loss(v, b.old_values, b.returns, w, kVClip);
      backward(vl);
      EXPECT_LT(rel_l2(vl, R.get("ppo.vloss")), 1e-5) << "value loss " << vl.item();
      EXPECT_LT(rel_l2(grad_of(v), R.get("ppo.dvalues").view({v.numel()})), 1e-5) << "dL/dvalues";
    }
    clear_tape();
  }

  static std::map<bool, std::unique_ptr<Reference>> refs;
};
std::map<bool, std::unique_ptr<Reference>> RlLossesTorch::refs;

TEST_F(RlLossesTorch, Grpo) { check("grpo"); }
TEST_F(RlLossesTorch, DrGrpo) { check("dr_grpo"); }
TEST_F(RlLossesTorch, ReinforcePlusPlus) { check("reinforce_pp"); }
TEST_F(RlLossesTorch, PpoWithGaeAndClippedValueLoss) { check("ppo"); }
TEST_F(RlLossesTorch, GrpoWithReplies) { check("grpo", true); }
TEST_F(RlLossesTorch, DrGrpoWithReplies) { check("dr_grpo", true); }
TEST_F(RlLossesTorch, ReinforcePlusPlusWithReplies) { check("reinforce_pp", true); }
TEST_F(RlLossesTorch, PpoWithGaeAndClippedValueLossWithReplies) { check("ppo", true); }

// The batch really exercises the clip: some ratios are outside [1 - lo, 1 + hi] on both sides.
TEST_F(RlLossesTorch, TheBatchClipsOnBothSides) {
  const Fixture* fx = reference(false).fx.get();
  Tensor lp = token_logprobs(fx->logits, fx->base.target);
  int below = 0, above = 0;
  for (int64_t i = 0; i < lp.numel(); ++i) {
    if (fx->base.target.i32()[i] < 0) continue;
    const double r = std::exp(double(lp.f32()[i]) - fx->base.old_logp.f32()[i]);
    below += r < 1 - kLo;
    above += r > 1 + kHi;
  }
  EXPECT_GT(below, 0);
  EXPECT_GT(above, 0);
  if (below == 0 || above == 0)
    for (int64_t i = 0; i < lp.numel(); ++i)
      if (fx->base.target.i32()[i] >= 0) ADD_FAILURE() << "ratio " << std::exp(double(lp.f32()[i]) - fx->base.old_logp.f32()[i]);
}

}  // namespace
}  // namespace atl::rl
