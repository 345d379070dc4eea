// Each optimizer's 10 steps on small matrices against tools/torch_optim_ref.py, a float64 PyTorch
// implementation written from the published pseudo-code. Tensors travel through safetensors files.
#include <unistd.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "core/config.h"
#include "optim/param_groups.h"
#include "tensor/rng.h"
#include "tensor/safetensors.h"

using namespace atl;
using json = nlohmann::json;

namespace {

struct RefResult {
  double param_rel = 0;  // rel_error of the final values
  double delta_rel = 0;  // rel_error of (final - initial): the optimizer's own contribution
};

double rel_vec(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

// Runs `algo` for `steps` steps in C++ (built through the config factory) and in PyTorch.
RefResult run_against_torch(const std::string& algo, json hp, const std::vector<Shape>& shapes, int steps = 10,
                            float sparse_rows = 0.f) {
  const float lr_scale = 0.9f, grad_scale = 0.5f;
  Rng rng(1234, 0);
  std::vector<ParamRef> params;
  std::vector<Tensor> w0;
  std::vector<std::vector<Tensor>> grads(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    ParamRef p{"layer" + std::to_string(i) + ".weight", Tensor::empty(shapes[i]), Tensor::zeros(shapes[i])};
    rng.fill_normal(p.value, 0.f, 0.5f);
    w0.push_back(p.value.clone());
    for (int t = 0; t < steps; ++t) {
      Tensor g = Tensor::empty(shapes[i]);
      rng.fill_normal(g, 0.f, 1.f);
      if (sparse_rows > 0.f) {  // rows without a gradient, as tokens absent from a batch
        int64_t cols = g.numel() / g.size(0);
        for (int64_t r = 0; r < g.size(0); ++r)
          if (rng.uniform() < sparse_rows)
            for (int64_t c = 0; c < cols; ++c) g.f32()[r * cols + c] = 0.f;
      }
      grads[i].push_back(g);
    }
    params.push_back(p);
  }
  std::string toml = "[optim." + algo + "]\n";
  for (auto& [k, v] : hp.items()) toml += k + " = " + v.dump() + "\n";
  Config cfg = Config::parse(toml, "test.toml");
  auto opt = make_single_optimizer(cfg, algo, params);
  EXPECT_NO_THROW(cfg.finish());
  for (int t = 0; t < steps; ++t) {
    for (size_t i = 0; i < params.size(); ++i) params[i].grad.copy_from(grads[i][size_t(t)]);
    opt->step(StepContext{lr_scale, grad_scale});
  }

  json meta = hp;
  meta["algo"] = algo;
  meta["steps"] = steps;
  meta["lr_scale"] = lr_scale;
  meta["grad_scale"] = grad_scale;
  std::vector<std::pair<std::string, Tensor>> file;
  for (size_t i = 0; i < params.size(); ++i) {
    file.emplace_back("p" + std::to_string(i) + ".w0", w0[i]);
    for (int t = 0; t < steps; ++t) file.emplace_back("p" + std::to_string(i) + ".g" + std::to_string(t), grads[i][size_t(t)]);
  }
  static int counter = 0;  // ctest runs tests as separate processes in parallel: the pid keeps their files apart
  std::string base = std::string(ATOLL_BINARY_DIR) + "/optim_ref_" + algo + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  save_safetensors(base + ".in.safetensors", file, {{"config", meta.dump()}});
  std::string cmd = std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR + "/tools/torch_optim_ref.py " + base +
                    ".in.safetensors " + base + ".out.safetensors";
  int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  RefResult res;
  if (rc != 0) {
    res.param_rel = res.delta_rel = 1e9;
    return res;
  }
  TensorFile ref = load_safetensors(base + ".out.safetensors");
  std::vector<float> a, b, da, db;
  for (size_t i = 0; i < params.size(); ++i) {
    auto x = params[i].value.to_vector(), y = ref.get("p" + std::to_string(i) + ".w").to_vector(), x0 = w0[i].to_vector();
    for (size_t j = 0; j < x.size(); ++j) {
      a.push_back(x[j]);
      b.push_back(y[j]);
      da.push_back(x[j] - x0[j]);
      db.push_back(y[j] - x0[j]);
    }
  }
  std::remove((base + ".in.safetensors").c_str());
  std::remove((base + ".out.safetensors").c_str());
  res.param_rel = rel_vec(a, b);
  res.delta_rel = rel_vec(da, db);
  std::printf("  %s: rel error of values %.3g, of updates %.3g\n", algo.c_str(), res.param_rel, res.delta_rel);
  return res;
}

constexpr double kTol = 1e-5;

}  // namespace

TEST(OptimTorchRef, MuonQuinticNesterov) {
  json hp = {{"lr", 0.02}, {"momentum", 0.95}, {"nesterov", true}, {"weight_decay", 0.01},
             {"update_scale", "keller"}, {"layout", "in_out"}, {"ns_schedule", "quintic"}, {"ns_steps", 5}};
  auto r = run_against_torch("muon", hp, {{12, 20}, {24, 8}});
  EXPECT_LT(r.param_rel, kTol);
  EXPECT_LT(r.delta_rel, 1e-4);
}

TEST(OptimTorchRef, MuonPolarExpressGramRmsScale) {
  // Gram Newton-Schulz is the same polynomial as the plain reference, evaluated differently.
  json hp = {{"lr", 0.01}, {"momentum", 0.9}, {"nesterov", false}, {"weight_decay", 0.0},
             {"update_scale", "rms"}, {"layout", "out_in"}, {"ns_schedule", "polar_express"}, {"ns_steps", 6},
             {"ns_gram", true}, {"ns_gram_restarts", {2, 4}}};
  auto r = run_against_torch("muon", hp, {{10, 40}, {32, 12}});
  EXPECT_LT(r.param_rel, kTol);
  EXPECT_LT(r.delta_rel, 1e-4);
}

TEST(OptimTorchRef, PeriodicRowMuonRowsAndCols) {
  for (const char* scale : {"frobenius", "fit"})
    for (const char* axis : {"rows", "cols", "neurons"}) {
      json hp = {{"lr", 0.02}, {"momentum", 0.95}, {"nesterov", true}, {"weight_decay", 0.01},
                 {"update_scale", "spectral"}, {"layout", std::string(axis) == "neurons" ? "out_in" : "in_out"},
                 {"period", 3}, {"axis", axis}, {"row_scale", scale}};
      auto r = run_against_torch("prmuon", hp, {{12, 20}, {24, 8}});
      EXPECT_LT(r.param_rel, kTol) << axis << " " << scale;
      EXPECT_LT(r.delta_rel, 1e-4) << axis << " " << scale;
    }
}

TEST(OptimTorchRef, Dion3NeuronsAndRows) {
  for (const char* sel : {"neurons", "rows", "shorter"}) {
    json hp = {{"lr", 0.02}, {"fraction", 0.25}, {"mu", 0.95}, {"beta2", 0.95}, {"weight_decay", 0.01},
               {"select", sel}, {"update_scale", "spectral"}, {"layout", "in_out"}};
    auto r = run_against_torch("dion3", hp, {{16, 24}, {24, 12}});
    EXPECT_LT(r.param_rel, kTol) << sel;
    EXPECT_LT(r.delta_rel, 1e-4) << sel;
  }
  // dion's Gram setting: Gram Newton-Schulz (restart at iteration 2) with Polar Express, on the
  // k x len submatrices (6 x 16 and 3 x 24 here: wide enough for the Gram form), against the
  // plain iteration of the reference (the same polynomial).
  json hp = {{"lr", 0.02}, {"fraction", 0.25}, {"mu", 0.95}, {"beta2", 0.95}, {"weight_decay", 0.01},
             {"select", "neurons"}, {"update_scale", "spectral"}, {"layout", "in_out"},
             {"ns_schedule", "polar_express"}, {"ns_steps", 5}, {"ns_gram", true}};
  auto r = run_against_torch("dion3", hp, {{16, 24}, {24, 12}});
  EXPECT_LT(r.param_rel, kTol) << "gram";
  EXPECT_LT(r.delta_rel, 1e-4) << "gram";
}

TEST(OptimTorchRef, Soap) {
  // Square factors keep every eigenspace one-dimensional at the first step, so the basis is unique
  // up to signs (to which SOAP's update is invariant).
  json hp = {{"lr", 0.003}, {"beta1", 0.95}, {"beta2", 0.95}, {"eps", 1e-8}, {"weight_decay", 0.01},
             {"shampoo_beta", -1.0}, {"precondition_frequency", 3}};
  auto r = run_against_torch("soap", hp, {{6, 6}, {8, 8}});
  EXPECT_LT(r.param_rel, kTol);
  EXPECT_LT(r.delta_rel, 1e-4);
}

TEST(OptimTorchRef, SoapSeedStabilizations) {
  // Per-step power iteration + QR of the bases (F = 1), KL-Shampoo factors, bias-corrected factor
  // EMAs and the update rescaled to RMS 0.2, each alone and all together.
  const json base = {{"lr", 0.003}, {"beta1", 0.95}, {"beta2", 0.95}, {"eps", 1e-8}, {"weight_decay", 0.01},
                     {"shampoo_beta", -1.0}, {"precondition_frequency", 1}};
  std::vector<json> variants;
  for (json extra : {json{{"factor_update", "kl"}}, json{{"correct_shampoo_bias", true}}, json{{"update_rms", 0.2}},
                     json{{"factor_update", "kl"}, {"correct_shampoo_bias", true}, {"update_rms", 0.2}}}) {
    json hp = base;
    for (auto& [k, v] : extra.items()) hp[k] = v;
    auto r = run_against_torch("soap", hp, {{6, 6}, {8, 8}});
    EXPECT_LT(r.param_rel, kTol) << hp.dump();
    EXPECT_LT(r.delta_rel, 1e-4) << hp.dump();
  }
}

TEST(OptimTorchRef, EmberSparseRows) {
  // col_mean "all" is katop1234/ember's statistic; "active" atoll's earlier one.
  for (const char* col : {"all", "active"}) {
    json hp = {{"lr", 0.001}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.01}, {"col_mean", col}};
    auto r = run_against_torch("ember", hp, {{32, 8}, {20, 12}}, 10, 0.5f);
    EXPECT_LT(r.param_rel, kTol) << col;
    EXPECT_LT(r.delta_rel, 1e-4) << col;
  }
}

TEST(OptimTorchRef, AdamS) {
  json hp = {{"lr", 0.001}, {"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}, {"weight_decay", 0.1}};
  auto r = run_against_torch("adams", hp, {{6, 5}, {7}});
  EXPECT_LT(r.param_rel, kTol);
  EXPECT_LT(r.delta_rel, 1e-4);
}

TEST(OptimTorchRef, Lion) {
  json hp = {{"lr", 0.001}, {"beta1", 0.9}, {"beta2", 0.99}, {"weight_decay", 0.1}};
  auto r = run_against_torch("lion", hp, {{6, 5}, {7}});
  EXPECT_LT(r.param_rel, kTol);
  EXPECT_LT(r.delta_rel, 1e-4);
}
