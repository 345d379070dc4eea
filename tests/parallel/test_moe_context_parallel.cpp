// Context parallelism for the MoE family (models/moe with ring attention, parallel/context_parallel.h;
// Liu et al. 2023, "Ring Attention with Blockwise Transformers"), alone and with expert parallelism:
//  - cp 2 on 2 ranks (DDP over the cp pair), under recompute none and full, and dp 2 x cp 2 with
//    ep 2 on 4 ranks (ZeRO-3 over the 4, the ep pair carved out of each cp pair: each cp rank
//    routes its own spans' tokens to both ranks' experts): per-step losses, gradient norms,
//    balance losses and the final parameters over 10 AdamW steps equal one process running each
//    data-parallel rank's whole rows as a micro-batch;
//  - cp 2 x tp 2 through the trainer follows one rank;
//  - what does not compose (cp with token dropping) is refused before step 1, naming keys;
//  - `atoll train` with a moe preset and parallel.cp = 2 follows one rank.
//
// The balance loss is a function of the whole row (the per-expert counts and the token total);
// without their sum over cp each rank scores its own half's statistics. Measured with the cp sum
// and scale removed from nn/moe.cpp (each rank's layer as before this change): cp 2 then differs
// by 1.9e-3 in the balance loss, 3.4e-5 in the loss, 2.7e-4 in the gradient norm and 4.8e-4 in
// the parameters; ep 2 x cp 2 by 2.4e-3, 4.3e-5, 1.2e-4, 4.9e-4; the trainer's balance loss by up
// to 2.3e-3: every test below fails.
//
// Why 1e-6 relative holds on any x86-64 CPU: routing, norms, experts and head see the same tokens
// as the reference (each token's row is computed alone; the grouped GEMM's per-row result does not
// depend on which rows share the call, tests/kernels/test_grouped_gemm.cpp), and the dispatchers
// copy rows. What differs is the order of a few fp32 sums: ring attention merges two key blocks
// by the log-sum-exp rule instead of one softmax row (test_context_parallel.cpp: ~1e-7), the loss
// and the router's terms summed per rank then averaged, and a parameter's gradient summed over
// ranks instead of accumulated; a few ulps each, whatever the vector width. AdamW at lr 1e-3 and
// eps 1e-3 (the tensor-parallel tests' settings) does not amplify ulps of near-zero gradient
// entries into the trajectory, so over 10 steps they stay near 1e-7 (printed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/threads.h"
#include "harness.h"
#include "launch_fixture.h"
#include "models/moe/moe_model.h"
#include "nn/recompute.h"
#include "parallel/context_parallel.h"
#include "parallel/data_parallel.h"
#include "parallel/expert_parallel.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace atl;
using namespace atl::parallel;
using namespace atl::parallel::test;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kT = 16, kBatch = 2;
constexpr int kSteps = 10;
const AdamWConfig kAdam{1e-3f, 0.9f, 0.95f, 1e-3f, 0.1f};

// moe-tiny with 4 experts and both auxiliary losses weighted high enough to matter.
// drop: token dropping at capacity factor 1 (every step of these batches drops some assignments).
nn::MoEModelConfig model_config(bool drop = false) {
  nn::MoEModelConfig c = nn::MoEModelConfig::preset("moe-tiny");
  c.attn.block_size = kT;
  c.moe.n_experts = 4;
  c.moe.aux_loss_coef = 0.05;
  c.moe.z_loss_coef = 0.01;
  c.moe.drop_tokens = drop;
  c.moe.capacity_factor = 1.0;
  return c;
}

// Rows [first, first + n) of step s's global batch (inputs or targets), the same for any layout.
Tensor rows(int step, int64_t first, int64_t n, bool targets) {
  std::vector<int32_t> v(size_t(n * kT));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t t = 0; t < kT; ++t) {
      const int32_t tok = int32_t(mix(uint64_t(step) * 100003u + uint64_t(first + r) * 101u + uint64_t(t)) % 257u);
      v[size_t(r * kT + t)] = targets ? (tok * 31 + 7) % 257 : tok;
    }
  return Tensor::from_vector_i32(v, {n, kT});
}

struct Trace {
  std::vector<float> loss, gnorm, balance, z, params, dropped;
};

std::vector<float> full_params(DataParallel& dp, ExpertShards* ep) {
  std::vector<std::pair<std::string, Tensor>> sd, opt;
  dp.full_state(sd, opt);
  if (ep) ep->full_state(sd, opt);
  std::map<std::string, Tensor> by(sd.begin(), sd.end());
  std::vector<float> v;
  for (auto& [n, t] : by) {
    auto x = t.to_vector();
    v.insert(v.end(), x.begin(), x.end());
  }
  return v;
}

double metric(const nn::Model& m, const std::string& k) {
  for (auto& [name, v] : m.step_metrics())
    if (name == k) return v;
  ADD_FAILURE() << "no step metric " << k;
  return 0;
}

void apply_recompute(nn::Model& m, const std::string& recompute) {
  Config cfg = Config::parse("[train]\nrecompute = \"" + recompute + "\"\n", "moe_cp.toml");
  nn::apply_recompute_config(cfg, m);
}

// One process, every expert: each of `dp` data-parallel ranks' whole rows as a micro-batch, seed 1/dp.
Trace reference(int dp, const std::string& recompute, bool drop = false) {
  set_num_threads(1);
  nn::MoEModel model(model_config(drop));
  model.init_weights(5);
  apply_recompute(model, recompute);
  ParallelConfig pc;
  auto opt = make_data_parallel(model, nullptr, pc, kAdam);
  Trace tr;
  for (int s = 0; s < kSteps; ++s) {
    opt->zero_grad();
    double loss = 0, bal = 0, z = 0, dropped = 0;
    for (int r = 0; r < dp; ++r) {
      Tensor l = model.loss(rows(s, r * kBatch, kBatch, false), rows(s, r * kBatch, kBatch, true));
      loss += l.item() / dp;
      bal += metric(model, "moe_balance_loss") / dp;
      z += metric(model, "moe_z_loss") / dp;
      dropped += metric(model, "moe_dropped") / dp;
      backward(l, 1.f / float(dp));
    }
    opt->finish_backward();
    tr.loss.push_back(float(loss));
    tr.balance.push_back(float(bal));
    tr.z.push_back(float(z));
    tr.dropped.push_back(float(dropped));
    tr.gnorm.push_back(float(opt->grad_norm()));
    opt->step({1.f, 1.f});
  }
  tr.params = full_params(*opt, nullptr);
  return tr;
}

// A rank: ATOLL_MOE_CP_JOB = "<ep> <recompute> <tag> <drop 0|1> <hsdp 0|1>"; cp 2, dp_shard = world / 2
// (ZeRO-3 when above 1; with hsdp dp_replicate 2 x dp_shard world / 4, HSDP sharding over dp_shard x
// cp), ep carved out of dp_shard x cp (mesh.h: each cp pair is an ep group at ep 2).
void job_rank(const std::string& spec) {
  std::istringstream in(spec);
  int64_t ep = 1;
  int drop = 0, hsdp = 0;
  std::string recompute, tag;
  in >> ep >> recompute >> tag >> drop >> hsdp;
  set_num_threads(1);
  auto comm = comm::make_communicator("gloo");
  const int64_t W = comm->size();
  MeshShape shape;
  shape.cp = 2;
  shape.dp_replicate = hsdp ? 2 : 1;
  shape.dp_shard = W / 2 / shape.dp_replicate;
  shape.ep = ep;
  Mesh mesh(comm.get(), shape);
  std::unique_ptr<nn::Model> owned = std::make_unique<nn::MoEModel>(model_config(drop != 0));
  check_mesh_supported(shape, *owned);
  Config cfg = Config::parse("[parallel]\nep_dispatcher = \"all_to_all\"\n", "moe cp job");
  auto shards = apply_expert_parallel(cfg, owned, mesh, comm.get());  // null at ep 1
  nn::Model& model = *owned;
  model.init_weights(5);
  apply_recompute(model, recompute);
  auto ring = apply_context_parallel(model, mesh, kT);
  ParallelConfig pc;
  pc.strategy = shape.strategy(3);
  pc.mesh = shape;
  pc.hsdp_shard_size = int(shape.dp_shard);  // as ParallelConfig::from_config sets it under hsdp
  pc.bucket_mb = 0.004;
  auto dp = make_data_parallel(model, comm.get(), pc, kAdam, nullptr, {}, &mesh);
  if (shards) shards->attach(kAdam, dp->world());
  const int r = comm->rank();
  const int64_t data_rank = mesh.coord("dp_replicate") * shape.dp_shard + mesh.coord("dp_shard");  // the cp pair shares its rows
  Trace tr;
  for (int s = 0; s < kSteps; ++s) {
    dp->zero_grad();
    if (shards) shards->zero_grad();
    Tensor l = model.loss(rows(s, data_rank * kBatch, kBatch, false), rows(s, data_rank * kBatch, kBatch, true));
    const double lv = l.item();
    tr.balance.push_back(float(dp->average(metric(model, "moe_balance_loss"))));  // as the trainer reports it
    tr.z.push_back(float(dp->average(metric(model, "moe_z_loss"))));
    tr.dropped.push_back(float(dp->average(metric(model, "moe_dropped"))));
    backward(l);
    dp->finish_backward();
    if (shards) shards->finish_backward();
    tr.loss.push_back(float(dp->average(lv)));
    tr.gnorm.push_back(float(shards ? shards->grad_norm(dp->grad_norm()) : dp->grad_norm()));
    dp->step({1.f, 1.f});
    if (shards) shards->step({1.f, 1.f});
  }
  tr.params = full_params(*dp, shards.get());
  write_floats(tag + ".loss." + std::to_string(r), tr.loss);
  write_floats(tag + ".gnorm." + std::to_string(r), tr.gnorm);
  write_floats(tag + ".balance." + std::to_string(r), tr.balance);
  write_floats(tag + ".z." + std::to_string(r), tr.z);
  write_floats(tag + ".dropped." + std::to_string(r), tr.dropped);
  write_floats(tag + ".params." + std::to_string(r), tr.params);
  write_floats(tag + ".layout." + std::to_string(r),
               {float(mesh.coord("cp")), float(mesh.coord("ep")), float(data_rank)});
  std::printf("rank %d: %s, strategy %s\n", r, shape.describe().c_str(), dp->name().c_str());
}

struct Scratch {
  fs::path root = fs::temp_directory_path() / ("atoll_moe_cp_" + std::to_string(::getpid()));
  Scratch() { fs::create_directories(root); }
  ~Scratch() { fs::remove_all(root); }
};

void job_equals_reference(int world, int64_t ep, const std::string& recompute, bool drop = false,
                          bool hsdp = false) {
  Scratch s;
  const std::string tag = (s.root / "job").string();
  auto codes = run_rank_programs(
      world, "MoEContextParallel.RankProgram",
      {"ATOLL_MOE_CP_JOB=" + std::to_string(ep) + " " + recompute + " " + tag + " " + (drop ? "1" : "0") + " " +
       (hsdp ? "1" : "0")},
      tag, 180);
  const std::string what = std::to_string(world) + " ranks, cp 2, ep " + std::to_string(ep) + ", recompute " +
                           recompute + (drop ? ", token dropping" : "") + (hsdp ? ", hsdp (2 replicas)" : "");
  auto got = collect_kinds(tag, codes, {"loss", "gnorm", "balance", "z", "params", "dropped"}, what);
  ASSERT_EQ(got.size(), 6u) << what;
  // The layout: rank r = dp * 2 + cp; at ep 2 the ep coordinate is the cp one (the cp pair is the ep group).
  for (int r = 0; r < world; ++r) {
    const auto lay = read_floats(tag + ".layout." + std::to_string(r));
    ASSERT_EQ(lay.size(), 3u);
    EXPECT_EQ(lay[0], float(r % 2)) << what << ": rank " << r << "'s cp coordinate";
    EXPECT_EQ(lay[1], ep > 1 ? float(r % 2) : 0.f) << what << ": rank " << r << "'s ep coordinate";
    EXPECT_EQ(lay[2], float(r / 2)) << what << ": rank " << r << "'s data coordinate";
  }
  const Trace ref = reference(world / 2, recompute, drop);
  EXPECT_LT(ref.loss.back(), ref.loss.front()) << "the reference did not train";
  // The dropped fraction: 0 without dropping; with it, some at every step, and the cp ranks'
  // mean is the whole rows' (equal token counts per rank). Assignment counts: exact up to f32.
  for (int i = 0; i < kSteps; ++i) {
    if (drop) EXPECT_GT(ref.dropped[size_t(i)], 0.f) << what << ": step " << i + 1 << " dropped nothing";
    else EXPECT_EQ(ref.dropped[size_t(i)], 0.f);
    EXPECT_NEAR(got["dropped"][size_t(i)], ref.dropped[size_t(i)], 1e-6) << what << ": step " << i + 1;
  }
  for (int i = 0; i < kSteps; ++i)
    std::printf("step %d: loss %.9g vs %.9g, balance %.9g vs %.9g, grad norm %.9g vs %.9g\n", i + 1,
                got["loss"][size_t(i)], ref.loss[size_t(i)], got["balance"][size_t(i)], ref.balance[size_t(i)],
                got["gnorm"][size_t(i)], ref.gnorm[size_t(i)]);
  std::printf("%s rel: loss %.3g, balance %.3g, z %.3g, grad norm %.3g, params %.3g\n", what.c_str(),
              rel_diff(got["loss"], ref.loss), rel_diff(got["balance"], ref.balance), rel_diff(got["z"], ref.z),
              rel_diff(got["gnorm"], ref.gnorm), rel_diff(got["params"], ref.params));
  const std::pair<const char*, const std::vector<float>*> want[] = {
      {"loss", &ref.loss}, {"gnorm", &ref.gnorm}, {"balance", &ref.balance}, {"z", &ref.z}, {"params", &ref.params}};
  for (auto& [k, v] : want) {
    ASSERT_EQ(got[k].size(), v->size()) << what << ": " << k;
    EXPECT_LT(rel_diff(got[k], *v), 1e-6) << what << ": " << k;
  }
}

// A config for `atoll train` (the moe-tiny preset at 4 experts, both auxiliary losses on).
fs::path train_config(const Scratch& s, const std::string& run, const std::string& model_extra,
                      const std::string& parallel) {
  std::ostringstream c;
  c << "[run]\ndir = \"" << (s.root / run).string() << "\"\n[data]\ndir = \"" << (s.root / "data").string()
    << "\"\nauto_prepare = false\n[model]\nfamily = \"moe\"\npreset = \"moe-tiny\"\nn_experts = 4\n"
    << "aux_loss_coef = 0.05\nz_loss_coef = 0.01\n" << model_extra << "[train]\nsteps = 4\nbatch_size = 4\n"
    << "seq_len = 16\nwarmup_steps = 1\nthreads = 1\n[optim.adamw]\nlr = 1e-3\neps = 1e-3\n[eval]\nevery = 0\n"
    << "[sample]\nevery = 0\n[checkpoint]\nevery = 0\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n"
    << (parallel.empty() ? "" : "[parallel]\n" + parallel);
  fs::path p = s.root / (run + ".toml");
  std::ofstream(p) << c.str();
  return p;
}

void prepare_corpus(const Scratch& s) {
  prepare_word_corpus(s.root, {"rings", "carry", "keys", "and", "values", "while", "experts", "take", "tokens", "home"}, 4242);
}

}  // namespace

// A rank of the multi-process tests when ATOLL_MOE_CP_JOB or ATOLL_MOE_CP_TRAIN_CFG is set.
TEST(MoEContextParallel, RankProgram) {
  if (const char* c = std::getenv("ATOLL_MOE_CP_TRAIN_CFG")) {
    Config cfg = Config::load(c);
    Trainer(cfg).run(false);
    return;
  }
  if (const char* j = std::getenv("ATOLL_MOE_CP_JOB")) return job_rank(j);
  // Run directly: the reference is deterministic bit for bit, so a mismatch is the parallelism's.
  Trace a = reference(1, "none"), b = reference(1, "none");
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.params, b.params);
}

TEST(MoEContextParallel, Cp2OnTwoRanksFollowsOneProcess) { job_equals_reference(2, 1, "none"); }

// Full recompute of an MoE block reruns its ring attention and its routers' cp sums in backward.
TEST(MoEContextParallel, Cp2WithFullRecomputeFollowsOneProcess) { job_equals_reference(2, 1, "full"); }

TEST(MoEContextParallel, Ep2TimesCp2OnFourRanksFollowsOneProcess) { job_equals_reference(4, 2, "none"); }

// Token dropping over split rows: the capacity is the whole rows', served first come, first served
// in the rows' order (row, position, slot) across the cp ranks (nn/moe.cpp, context_kept). Without
// the counts' exchange each rank would serve its own half at half the capacity: measured with that
// local rule (each rank's kept = min(ceil(factor * its tokens * k / E), count)), cp 2 drops 0.008-0.06
// more of the assignments than the reference at every step, and its parameters differ by 1.3e-3
// relative after 10 steps (grad norm 1.1e-4): every test below fails. Under full recompute the routing
// (and its exchange) runs again in backward; with ep 2 the kept rows go to the other rank's experts.
TEST(MoEContextParallel, Cp2WithTokenDroppingFollowsOneProcess) { job_equals_reference(2, 1, "none", true); }
TEST(MoEContextParallel, Cp2WithTokenDroppingAndFullRecomputeFollowsOneProcess) {
  job_equals_reference(2, 1, "full", true);
}
TEST(MoEContextParallel, Ep2TimesCp2WithTokenDroppingOnFourRanksFollowsOneProcess) {
  job_equals_reference(4, 2, "none", true);
}

// ep 2 x cp 2 under HSDP on 8 ranks: 2 replicas of dp_shard 2 x cp 2, the dense parameters sharded
// over each replica's 4 ranks and their gradients also averaged over the 2 replicas, the experts
// (outside the flat buffers, expert_shards.h) summed over the 4 ranks of their ep coordinate; with
// token dropping, so that the rows' capacity exchange runs too. 4 data ranks against one process.
TEST(MoEContextParallel, Ep2TimesCp2UnderHsdpOnEightRanksFollowsOneProcess) {
  job_equals_reference(8, 2, "none", true, true);
}

// `atoll train` on `world` ranks with the [parallel] lines `parallel` against one rank on the same
// batches: 4 steps' losses within 1e-6 relative, balance and z losses within 1e-6 (the trainer
// reports each metric averaged over the ranks, as above); each of `layout` in rank 0's log.
static void expect_trainer_follows_one_rank(const std::string& run, int world, const std::string& parallel,
                                            const std::vector<std::string>& layout, const std::string& model = "") {
  Scratch s;
  ASSERT_NO_FATAL_FAILURE(prepare_corpus(s));
  {
    Config one = Config::load(train_config(s, "one", model, "").string());
    Trainer(one).run(false);
  }
  fs::path cfg = train_config(s, run, model, parallel);
  const std::string tag = (s.root / run).string() + "_log";
  auto codes = run_rank_programs(world, "MoEContextParallel.RankProgram", {"ATOLL_MOE_CP_TRAIN_CFG=" + cfg.string()},
                                 tag, 120);
  for (size_t r = 0; r < codes.size(); ++r)
    ASSERT_EQ(codes[r], 0) << "rank " << r << ":\n" << read_file(tag + ".log" + std::to_string(r));
  const std::string log0 = read_file(tag + ".log0");
  for (const std::string& l : layout) EXPECT_NE(log0.find(l), std::string::npos) << l << "\n" << log0;
  const auto one = read_metrics((s.root / "one" / "metrics.jsonl").string()),
             got = read_metrics((s.root / run / "metrics.jsonl").string());
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < one.size(); ++i) {
    std::printf("%s step %zu: loss %.9g vs %.9g, balance %.9g vs %.9g\n", run.c_str(), i + 1, double(got[i]["loss"]),
                double(one[i]["loss"]), double(got[i]["moe_balance_loss"]), double(one[i]["moe_balance_loss"]));
    EXPECT_NEAR(double(got[i]["loss"]), double(one[i]["loss"]), 1e-6 * double(one[i]["loss"])) << run << " step " << i + 1;
    EXPECT_NEAR(double(got[i]["moe_balance_loss"]), double(one[i]["moe_balance_loss"]), 1e-6) << run << " step " << i + 1;
    EXPECT_NEAR(double(got[i]["moe_z_loss"]), double(one[i]["moe_z_loss"]), 1e-6) << run << " step " << i + 1;
    EXPECT_NEAR(double(got[i]["moe_dropped"]), double(one[i]["moe_dropped"]), 1e-6) << run << " step " << i + 1;
    if (model.find("drop_tokens = true") != std::string::npos)
      EXPECT_GT(double(one[i]["moe_dropped"]), 0.0) << run << " step " << i + 1 << " dropped nothing";
  }
}

// parallel.cp = 2 on 2 ranks.
TEST(MoEContextParallel, TrainerRunsCp2AndFollowsOneRank) { expect_trainer_follows_one_rank("cp", 2, "cp = 2\n", {"cp=2"}); }

// The same with token dropping (capacity factor 1): every step drops assignments, as one rank does.
TEST(MoEContextParallel, TrainerRunsCp2WithTokenDroppingAndFollowsOneRank) {
  expect_trainer_follows_one_rank("cpdrop", 2, "cp = 2\n", {"cp=2"}, "drop_tokens = true\ncapacity_factor = 1.0\n");
}

// cp 2 x tp 2 through the trainer (4 ranks, sequence parallelism on): each cp rank's spans are
// split again over its tp pair, the routers' counts and token totals summed over tp and then cp
// (nn/moe.cpp), the experts' and attention's matrices split over tp. The cp test's bounds, as
// tp's partial-product sums add a few ulps per step as cp's block merge does
// (tests/parallel/test_tensor_parallel.cpp measures ~1e-7 per step).
TEST(MoEContextParallel, TrainerRunsCp2TimesTp2AndFollowsOneRank) {
  expect_trainer_follows_one_rank("cptp", 4, "cp = 2\ntp = 2\n", {"cp=2", "tp=2", "sequence parallel on"});
}

// What does not compose yet is refused before any update, naming the keys: cp x tp with token
// dropping (4 ranks; under sequence parallelism the capacity is each tp rank's own tokens').
TEST(MoEContextParallel, WhatDoesNotComposeIsRefusedBeforeStepOne) {
  Scratch s;
  ASSERT_NO_FATAL_FAILURE(prepare_corpus(s));  // the refusal comes at the first forward
  struct Bad {
    const char* name;
    int world;
    std::string model, parallel, want;
  };
  const Bad bad[] = {{"droptp", 4, "drop_tokens = true\n", "cp = 2\ntp = 2\n",
                      "model.drop_tokens = true with parallel.cp = 2 and parallel.tp"}};
  for (const Bad& b : bad) {
    fs::path cfg = train_config(s, b.name, b.model, b.parallel);
    const std::string tag = (s.root / b.name).string() + "_log";
    auto codes = run_rank_programs(b.world, "MoEContextParallel.RankProgram",
                                   {"ATOLL_MOE_CP_TRAIN_CFG=" + cfg.string()}, tag, 120);
    for (size_t r = 0; r < codes.size(); ++r) {
      EXPECT_NE(codes[r], 0) << b.name << ": rank " << r << " accepted the layout";
      const std::string log = read_file(tag + ".log" + std::to_string(r));
      EXPECT_NE(log.find(b.want), std::string::npos) << b.name << ":\n" << log;
      EXPECT_EQ(log.find("step     1"), std::string::npos) << b.name << ": a step ran:\n" << log;
    }
  }
}
