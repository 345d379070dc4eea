// Identities between the optimizers that must hold exactly (the same arithmetic in the same order),
// and the Periodic Row-wise Muon row step checked against the paper's definition.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/config.h"
#include "optim/newton_schulz.h"
#include "optim/param_groups.h"
#include "optim/periodic_row_muon.h"
#include "tensor/rng.h"

using namespace atl;

namespace {

struct OptRun {
  std::vector<ParamRef> params;
  std::vector<std::vector<Tensor>> grads;  // per step, per parameter
};

OptRun make_run(const std::vector<Shape>& shapes, int steps, uint64_t seed = 7) {
  Rng rng(seed, 0);
  OptRun r;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ParamRef p{"h" + std::to_string(i) + ".weight", Tensor::empty(shapes[i]), Tensor::zeros(shapes[i])};
    rng.fill_normal(p.value, 0.f, 0.5f);
    r.params.push_back(p);
  }
  for (int t = 0; t < steps; ++t) {
    r.grads.emplace_back();
    for (auto& s : shapes) {
      Tensor g = Tensor::empty(s);
      rng.fill_normal(g, 0.f, 1.f);
      r.grads.back().push_back(g);
    }
  }
  return r;
}

// Runs `type` from the TOML section text over the run's gradients; returns the final values.
std::vector<std::vector<float>> run_opt(const std::string& type, const std::string& section, const OptRun& base) {
  std::vector<ParamRef> params;
  for (auto& p : base.params) params.push_back({p.name, p.value.clone(), Tensor::zeros(p.value.shape())});
  Config cfg = Config::parse("[optim." + type + "]\n" + section, "test.toml");
  auto opt = make_single_optimizer(cfg, type, params);
  cfg.finish();
  for (auto& gs : base.grads) {
    for (size_t i = 0; i < params.size(); ++i) params[i].grad.copy_from(gs[i]);
    opt->step(StepContext{0.8f, 0.7f});
  }
  std::vector<std::vector<float>> out;
  for (auto& p : params) out.push_back(p.value.to_vector());
  return out;
}

}  // namespace

// K = 1 makes every step a refresh, and a refresh is Muon's step: the same momentum, the same
// Newton-Schulz, the same scale. Bit-identical, so the comparison is ==, for every schedule
// option and both Nesterov settings.
TEST(OptimIdentities, PrMuonWithPeriodOneIsMuon) {
  OptRun r = make_run({{12, 20}, {24, 8}, {16, 16}}, 6);
  const char* variants[] = {
      "lr = 0.02\nmomentum = 0.95\nnesterov = true\nweight_decay = 0.01\n",
      "lr = 0.03\nmomentum = 0.9\nnesterov = false\nupdate_scale = \"spectral\"\nns_schedule = \"polar_express\"\n"
      "ns_steps = 8\n",
      "lr = 0.01\nupdate_scale = \"rms\"\nlayout = \"out_in\"\nns_gram = true\nns_gram_min_aspect = 1.0\n",
  };
  for (const char* v : variants) {
    auto muon = run_opt("muon", v, r);
    for (const char* scale : {"fit", "frobenius"}) {
      auto pr = run_opt("prmuon", std::string(v) + "period = 1\nrow_scale = \"" + scale + "\"\n", r);
      for (size_t i = 0; i < muon.size(); ++i) {
        ASSERT_EQ(muon[i].size(), pr[i].size());
        size_t diff = 0;
        for (size_t j = 0; j < muon[i].size(); ++j) diff += muon[i][j] != pr[i][j];
        EXPECT_EQ(diff, 0u) << "param " << i << " " << scale << " with\n" << v;
      }
    }
  }
}

// The paper's row step: each row of the current (Nesterov) momentum normalized to unit norm and
// scaled so that the update's RMS equals that of the spectral (orthogonal) update,
// RMS(O) = sqrt(min(m, n) / (m n)). row_scale = "frobenius" is that definition. Checked on the
// second step of a K = 2 run against a direct computation from the momentum, in double.
TEST(OptimIdentities, PrMuonRowStepIsRmsMatchedRowNormalization) {
  const int64_t m = 12, n = 20;
  const float lr = 0.02f, beta = 0.9f;
  for (const char* axis : {"rows", "cols", "neurons"}) {
    OptRun r = make_run({{m, n}}, 2, 11);
    std::vector<ParamRef> params{{"h.weight", r.params[0].value.clone(), Tensor::zeros({m, n})}};
    Config cfg = Config::parse(std::string("[optim.prmuon]\nlr = 0.02\nmomentum = 0.9\nnesterov = true\n") +
                                   "update_scale = \"none\"\nperiod = 2\nrow_scale = \"frobenius\"\naxis = \"" + axis +
                                   "\"\n",
                               "test.toml");
    auto opt = make_single_optimizer(cfg, "prmuon", params);
    cfg.finish();
    params[0].grad.copy_from(r.grads[0][0]);
    opt->step(StepContext{1.f, 1.f});
    std::vector<float> w1 = params[0].value.to_vector();
    params[0].grad.copy_from(r.grads[1][0]);
    opt->step(StepContext{1.f, 1.f});
    std::vector<float> w2 = params[0].value.to_vector();

    // Momentum after two steps and its Nesterov blend, in double.
    auto g0 = r.grads[0][0].to_vector(), g1 = r.grads[1][0].to_vector();
    std::vector<double> u(size_t(m * n));
    for (size_t j = 0; j < u.size(); ++j) {
      double M = (1 - beta) * g0[j];
      M = beta * M + (1 - beta) * g1[j];
      u[j] = (1 - beta) * g1[j] + beta * M;
    }
    // "neurons" on atoll's [in, out] layout: the output neurons are the columns.
    const bool rows = std::string(axis) == "rows";
    const int64_t slices = rows ? m : n;
    std::vector<double> norm(size_t(slices), 0.0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) norm[size_t(rows ? i : j)] += u[size_t(i * n + j)] * u[size_t(i * n + j)];
    double upd_sq = 0, max_rel = 0;
    const double target_rms = std::sqrt(double(std::min(m, n)) / double(m * n));
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double R = u[size_t(i * n + j)] / std::sqrt(norm[size_t(rows ? i : j)]);
        double expect = R * std::sqrt(double(std::min(m, n)) / double(slices));
        double got = (double(w1[size_t(i * n + j)]) - double(w2[size_t(i * n + j)])) / lr;
        upd_sq += got * got;
        max_rel = std::max(max_rel, std::fabs(got - expect) / (std::fabs(expect) + 1e-3));
      }
    // f32 arithmetic on O(1) values, differences of parameters of size ~0.5 divided by lr: ~1e-5.
    EXPECT_LT(max_rel, 1e-3) << axis;
    EXPECT_NEAR(std::sqrt(upd_sq / double(m * n)), target_rms, 1e-3 * target_rms) << axis;
  }
}

// axis = "neurons" is the columns of an [in, out] weight and the rows of an [out, in] one.
TEST(OptimIdentities, PrMuonNeuronsAxisFollowsLayout) {
  OptRun r = make_run({{12, 20}}, 3);
  auto common = std::string("period = 2\nrow_scale = \"frobenius\"\n");
  EXPECT_EQ(run_opt("prmuon", common + "axis = \"neurons\"\n", r), run_opt("prmuon", common + "axis = \"cols\"\n", r));
  EXPECT_EQ(run_opt("prmuon", common + "layout = \"out_in\"\naxis = \"neurons\"\n", r),
            run_opt("prmuon", common + "layout = \"out_in\"\naxis = \"rows\"\n", r));
  EXPECT_NE(run_opt("prmuon", common + "axis = \"neurons\"\n", r), run_opt("prmuon", common + "axis = \"rows\"\n", r));
}

// Dion3's accumulator (dion's NorDion2): M <- M + G every step; only the slices selected this step
// (the top ceil(alpha * #slices) by L1 norm of M) are multiplied by mu, the others keep their sum
// undecayed. Checked on the saved state after two steps, slice by slice, for neurons (columns of
// an [in, out] weight) and rows.
TEST(OptimIdentities, Dion3DecaysOnlyTheSelectedSlices) {
  const int64_t m = 8, n = 12;
  const float mu = 0.5f;
  for (const char* sel : {"neurons", "rows"}) {
    OptRun r = make_run({{m, n}}, 2, 5);
    std::vector<ParamRef> params{{"h.weight", r.params[0].value.clone(), Tensor::zeros({m, n})}};
    Config cfg = Config::parse(std::string("[optim.dion3]\nfraction = 0.25\nmu = 0.5\nselect = \"") + sel + "\"\n",
                               "test.toml");
    auto opt = make_single_optimizer(cfg, "dion3", params);
    cfg.finish();
    const bool by_rows = std::string(sel) == "rows";
    const int64_t slices = by_rows ? m : n, len = by_rows ? n : m;
    const int64_t k = (slices + 3) / 4;  // ceil(0.25 * slices)
    auto at = [&](int64_t s, int64_t j) { return size_t(by_rows ? s * n + j : j * n + s); };
    std::vector<double> M(size_t(m * n), 0.0);
    for (int t = 0; t < 2; ++t) {
      params[0].grad.copy_from(r.grads[size_t(t)][0]);
      opt->step(StepContext{1.f, 1.f});
      auto g = r.grads[size_t(t)][0].to_vector();
      for (size_t j = 0; j < M.size(); ++j) M[j] += g[j];
      std::vector<double> l1(size_t(slices), 0.0);
      for (int64_t s = 0; s < slices; ++s)
        for (int64_t j = 0; j < len; ++j) l1[size_t(s)] += std::fabs(M[at(s, j)]);
      std::vector<int64_t> order(static_cast<size_t>(slices));
      for (int64_t s = 0; s < slices; ++s) order[size_t(s)] = s;
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l1[size_t(a)] > l1[size_t(b)]; });
      for (int64_t q = 0; q < k; ++q)
        for (int64_t j = 0; j < len; ++j) M[at(order[size_t(q)], j)] *= mu;
    }
    std::vector<std::pair<std::string, Tensor>> state;
    opt->save_state(state, "");
    std::vector<float> got;
    for (auto& [name, t] : state)
      if (name == "h.weight.momentum") got = t.to_vector();
    ASSERT_EQ(got.size(), M.size()) << sel;
    double worst = 0;
    for (size_t j = 0; j < M.size(); ++j) worst = std::max(worst, std::fabs(double(got[j]) - M[j]));
    // Sums of two N(0, 1) draws in f32, against double: rounding only.
    EXPECT_LT(worst, 1e-5) << sel;
  }
}
