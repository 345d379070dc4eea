// Whole-matrix optimizers under tensor parallelism (parallel/optim/tp_whole_matrix.h): Muon,
// PRMuon, Dion3, SOAP on the hidden matrices and Ember on the vocabulary-split tables, at tp2 and
// dp2 x tp2, against one rank on the same global batch.
//
// Two checks, because two things differ between a tp job and one rank:
// - The update. Each step every rank also steps a one-rank optimizer of the same route (the
//   "shadow") over whole copies of the tp job's own parameters and gradients (gathered), from the
//   same state. The tp form must give every parameter of its whole-matrix groups the shadow's
//   update bit for bit: it steps the same whole tensors through the same kernels. Any error in
//   gathering, in the blocks kept or in the state shows at full size.
// - The trajectory. Tensor parallelism reorders fp32 sums in forward and backward (a few ulps,
//   test_tensor_parallel.cpp: gradients within 5.2e-7 over 10 AdamW steps), and a whole-matrix
//   optimizer carries that on along the run; the bounds are derived at the tests.
//
// Multi-process runs start this binary under --gtest_filter=TensorParallelOptim.RankProgram with the
// job in ATOLL_TPO_JOB; that test plays one rank and writes ATOLL_TPO_TAG.<kind>.<rank>.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "autograd/graph.h"
#include "core/config.h"
#include "core/threads.h"
#include "harness.h"
#include "optim/clip.h"
#include "optim/param_groups.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/optim/placement.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"
#include "tp_batch.h"

namespace atl::parallel {
namespace {

using test::mix;
using test::write_floats;

constexpr int64_t kT = 8;
constexpr float kClip = 0.5f;

struct Job {
  std::string model = "gpt2";  // gpt2 (tied head, vocabulary 67 split 33 + 34) | llama (GQA, untied)
  std::string route = "muon";  // "<optim.type>[+<optim.embed and optim.head>]"
  int tp = 2, dp = 1, steps = 10, batch = 4;
  std::string strategy = "ddp";  // over dp: ddp | zero1 | zero2 | zero3 (dp_shard) | hsdp (shard 2 x replicate dp/2)
  std::string str() const {
    return fmt::format("{}:{}:{}:{}:{}:{}:{}", model, route, tp, dp, steps, batch, strategy);
  }
  static Job parse(const std::string& s) {
    std::vector<std::string> f;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ':')) f.push_back(item);
    Job j;
    j.model = f.at(0);
    j.route = f.at(1);
    j.tp = std::stoi(f.at(2));
    j.dp = std::stoi(f.at(3));
    j.steps = std::stoi(f.at(4));
    j.batch = std::stoi(f.at(5));
    j.strategy = f.at(6);
    return j;
  }
};

nn::GPTConfig model_config(const std::string& kind) {
  nn::GPTConfig c = nn::GPTConfig::preset(kind == "llama" ? "llama-tiny" : "gpt2-tiny");
  c.n_layer = 2;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = kind == "llama" ? 64 : 67;
  c.n_head = 4;
  c.n_kv_head = kind == "llama" ? 2 : 4;
  if (kind == "llama") c.ffn_hidden = 48;
  return c;
}

std::string optimizer_toml(const std::string& route) {
  const size_t plus = route.find('+');
  const std::string type = route.substr(0, plus);
  std::string t = fmt::format("[optim]\ntype = \"{}\"\n", type);
  if (plus != std::string::npos) t += fmt::format("embed = \"{0}\"\nhead = \"{0}\"\n", route.substr(plus + 1));
  t += "[optim.adamw]\nlr = 1e-3\nbeta1 = 0.9\nbeta2 = 0.95\neps = 1e-3\nweight_decay = 0.1\n";
  if (type == "soap") t += "[optim.soap]\nprecondition_frequency = 3\n";
  if (type == "prmuon") t += "[optim.prmuon]\nperiod = 3\n";
  return t;
}

// Rows [row0, row0 + rows) of step s's global batch (tp_batch.h, shared with test_tensor_parallel.cpp).
void batch_rows(int s, int row0, int rows, int64_t V, Tensor& x, Tensor& y) {
  tp_batch::rows(s, row0, rows, V, kT, x, y);
}

using Named = std::vector<std::pair<std::string, Tensor>>;

struct Result {
  std::vector<float> losses, params;  // params: the whole model's after the last step
  // Per step, over the parameters the whole-matrix groups hold: the largest |tp - shadow| of the
  // update; and over the element-wise groups' parameters the same (reported, not bounded to 0).
  std::vector<float> shadow_matrix, shadow_rest;
};

// This rank's parameters made whole (a copy), in parameter order. Under ZeRO-2/3 and HSDP
// (zero non-null) a rank holds only its chunks of the reduced gradient, and under ZeRO-3/HSDP
// between steps only its chunks of the weights: the chunks are summed over one replica's shard
// group first (zeros elsewhere, so the sum is exact).
Named whole_params(nn::Model& model, TensorParallel* tp, bool grads, const Zero* zero = nullptr) {
  Tensor flat = (grads ? model.flat_grads() : model.flat_values()).clone();
  if (zero && zero->shard_size() > 1) {
    std::vector<std::pair<int64_t, int64_t>> chunks =
        grads ? (zero->stage() >= 2 ? zero->reduced_grad_ranges() : std::vector<std::pair<int64_t, int64_t>>{})
              : zero->value_ranges();
    if (!chunks.empty()) {
      Tensor w = Tensor::zeros({flat.numel()});
      for (auto [lo, hi] : chunks) w.slice(0, lo, hi).copy_from(flat.slice(0, lo, hi));
      zero->shard_comm()->all_reduce(w);
      flat = w;
    }
  }
  const float* base = (grads ? model.flat_grads() : model.flat_values()).f32();
  Named v;
  for (nn::Parameter* p : model.parameters()) {
    const int64_t off = (grads ? p->grad : p->value).f32() - base;
    v.emplace_back(p->name, flat.slice(0, off, off + p->value.numel()).view(p->shape).clone());
  }
  Named none;
  if (tp) tp->full_state(v, none);
  return v;
}

Result run(comm::Communicator* comm, const Job& job) {
  nn::GPTConfig mc = model_config(job.model);
  std::unique_ptr<nn::Model> model = std::make_unique<nn::GPT>(mc);
  const std::string strategy = comm ? job.strategy : "ddp";
  const bool sharding = strategy != "ddp";
  MeshShape shape;
  shape.tp = comm ? job.tp : 1;
  if (strategy == "hsdp") {
    shape.dp_shard = 2;
    shape.dp_replicate = job.dp / 2;
  } else {
    (sharding ? shape.dp_shard : shape.dp_replicate) = comm ? job.dp : 1;
  }
  Mesh mesh(comm, shape);
  std::unique_ptr<TensorParallel> tp;
  if (comm) tp = TensorParallel::apply(model, mesh, true);
  model->init_weights(11);
  Config cfg = Config::parse(optimizer_toml(job.route), "tp optimizer test");
  comm::Communicator* dpc = comm ? data_parallel_comm(mesh) : nullptr;
  OptimizerPlacement placement = place_optimizer(cfg, *model, dpc, sharding, strategy, tp.get());
  EXPECT_TRUE(sharding ? bool(placement.sharded) : bool(placement.full)) << job.route;
  if (comm && !sharding) {
    EXPECT_NE(placement.note.find("gathered over tp"), std::string::npos) << placement.note;
  }
  // The shadow: the one-rank optimizer of the same route over whole copies (no override).
  Config shadow_cfg = Config::parse(optimizer_toml(job.route), "tp optimizer test (shadow)");
  Named sv = whole_params(*model, tp.get(), false), sg = whole_params(*model, tp.get(), false);
  std::vector<ParamRef> srefs;
  std::vector<bool> matrix_group;
  const OptimizerRoute route = optimizer_route(shadow_cfg);
  for (size_t i = 0; i < sv.size(); ++i) {
    nn::Parameter* p = model->parameters()[i];
    srefs.push_back({p->name, sv[i].second, sg[i].second, p->role});
    matrix_group.push_back(!optimizer_registry().get(route.of(classify_param(srefs.back()))).elementwise);
  }
  std::unique_ptr<Optimizer> shadow = comm ? make_optimizer(shadow_cfg, srefs) : nullptr;
  ParallelConfig pc;
  pc.strategy = strategy;
  pc.bucket_mb = 0.004;
  if (strategy == "hsdp") pc.hsdp_shard_size = int(shape.dp_shard);
  AdamWConfig ac = adamw_config_from(cfg);
  auto dp = make_data_parallel(*model, dpc, pc, ac, std::move(placement.full), placement.sharded, &mesh);
  if (tp) tp->attach(*dp);  // ZeRO-3 / HSDP: tp's partial gradients summed per unit (the trainer's order)
  const Zero* zero = dynamic_cast<const Zero*>(dp.get());
  const bool tp_first = tp && tp->sums_before(*dp);  // ZeRO-2: summed over tp before dp reduces
  const int d = comm ? int(mesh.coord("dp_replicate") * shape.dp_shard + mesh.coord("dp_shard")) : 0,
            D = comm ? job.dp : 1, b = job.batch / D;
  Result res;
  for (int s = 0; s < job.steps; ++s) {
    Tensor x, y;
    batch_rows(s, d * b, b, mc.vocab_size, x, y);
    dp->zero_grad();
    dp->set_sync(!tp_first);
    Tensor loss = model->loss(x, y);
    backward(loss);
    if (tp_first) tp->finish_backward();
    dp->finish_backward();
    if (tp && !tp_first) tp->finish_backward();
    const double norm = tp ? tp->grad_norm(*dp) : dp->grad_norm();
    res.losses.push_back(float(dp->average(loss.item())));
    const StepContext ctx{1.f, clip_coefficient(norm, kClip)};
    if (shadow) {  // the shadow starts each step where the tp job is, from its own (equal) state
      Named v = whole_params(*model, tp.get(), false, zero), g = whole_params(*model, tp.get(), true, zero);
      for (size_t i = 0; i < v.size(); ++i) {
        srefs[i].value.copy_from(v[i].second);
        srefs[i].grad.copy_from(g[i].second);
      }
      shadow->step(ctx);
    }
    dp->step(ctx);
    if (shadow) {
      Named after = whole_params(*model, tp.get(), false, zero);
      float worst_m = 0, worst_r = 0;
      for (size_t i = 0; i < after.size(); ++i) {
        const float *a = after[i].second.f32(), *w = srefs[i].value.f32();
        float& worst = matrix_group[i] ? worst_m : worst_r;
        for (int64_t k = 0; k < after[i].second.numel(); ++k) worst = std::max(worst, std::fabs(a[k] - w[k]));
      }
      res.shadow_matrix.push_back(worst_m);
      res.shadow_rest.push_back(worst_r);
    }
  }
  for (auto& [n, t] : whole_params(*model, tp.get(), false, zero)) res.params.insert(res.params.end(), t.f32(), t.f32() + t.numel());
  return res;
}

std::string tag_path(const std::string& name) { return "/tmp/atoll_tpo_" + std::to_string(getpid()) + "_" + name; }

Result run_ranks(const Job& job, const std::string& name) {
  std::string tag = tag_path(name);
  auto codes = test::run_rank_programs(job.tp * job.dp, "TensorParallelOptim.RankProgram",
                                       {"ATOLL_TPO_JOB=" + job.str(), "ATOLL_TPO_TAG=" + tag}, tag, 120);
  auto k = test::collect_kinds(tag, codes, {"losses", "params", "shadow_matrix", "shadow_rest"}, name);
  return {k["losses"], k["params"], k["shadow_matrix"], k["shadow_rest"]};
}

double max_of(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(x));
  return m;
}

// Runs the job at tp (x dp) and on one rank; checks the update against the shadow (bit for bit),
// the loss per step and the final parameters within the given bounds; returns the final
// parameters' difference (norm-wise relative).
double expect_matches(const Job& job, double loss_tol, double param_tol) {
  const std::string name = job.route + "_" + job.model + "_tp" + std::to_string(job.tp) + "dp" + std::to_string(job.dp) +
                           (job.strategy == "ddp" ? "" : "_" + job.strategy);
  set_num_threads(1);
  Result one = run(nullptr, job);
  Result par = run_ranks(job, name);
  EXPECT_EQ(par.losses.size(), size_t(job.steps)) << name;
  if (par.losses.size() != one.losses.size()) return INFINITY;
  EXPECT_LT(one.losses.back(), one.losses.front()) << name << ": the loss must fall";
  EXPECT_EQ(par.shadow_matrix.size(), size_t(job.steps)) << name;
  EXPECT_EQ(max_of(par.shadow_matrix), 0.0) << name << ": the tp form's update differs from one rank's on the same "
                                            << "whole matrices";
  double worst_loss = 0;
  for (size_t s = 0; s < one.losses.size(); ++s) {
    const double rel = std::fabs(par.losses[s] - one.losses[s]) / std::fabs(one.losses[s]);
    worst_loss = std::max(worst_loss, rel);
    EXPECT_LE(rel, loss_tol) << name << ": loss at step " << s + 1;
  }
  double num = 0, den = 0;
  EXPECT_EQ(par.params.size(), one.params.size()) << name;
  for (size_t i = 0; i < std::min(par.params.size(), one.params.size()); ++i) {
    num += (double(par.params[i]) - one.params[i]) * (double(par.params[i]) - one.params[i]);
    den += double(one.params[i]) * one.params[i];
  }
  const double prm = std::sqrt(num / den);
  EXPECT_LE(prm, param_tol) << name << ": final parameters";
  std::printf("[%s] update vs one rank on the same matrices: %.1e (element-wise groups %.1e); loss %.1e, final "
              "parameters %.1e against one rank\n",
              name.c_str(), max_of(par.shadow_matrix), max_of(par.shadow_rest), worst_loss, prm);
  return prm;
}

}  // namespace

TEST(TensorParallelOptim, RankProgram) {
  const char* j = std::getenv("ATOLL_TPO_JOB");
  if (!j) {
    // In-process: the placement at one rank (no tp) is the plain grouped optimizer, whose
    // trajectory the tests compare against; it must train.
    set_num_threads(1);
    Job job;
    job.steps = 3;
    Result a = run(nullptr, job);
    ASSERT_EQ(a.losses.size(), 3u);
    EXPECT_LT(a.losses.back(), a.losses.front());
    return;
  }
  set_num_threads(1);
  Job job = Job::parse(j);
  auto comm = comm::make_communicator("gloo");
  const std::string tag = std::getenv("ATOLL_TPO_TAG"), r = std::to_string(comm->rank());
  Result res = run(comm.get(), job);
  write_floats(tag + ".losses." + r, res.losses);
  write_floats(tag + ".params." + r, res.params);
  write_floats(tag + ".shadow_matrix." + r, res.shadow_matrix);
  write_floats(tag + ".shadow_rest." + r, res.shadow_rest);
}

// Every whole-matrix type of the registry at tp2 on the Llama-style model (GQA's fused q/k/v cut
// per part, SwiGLU's gate and up, an untied head; Ember on the vocabulary-split embedding and
// head): the update is one rank's bit for bit (measured 0 for all five), and the element-wise
// groups' too (AdamW on the blocks, measured 0).
// Trajectory bounds. The tp job's gradients differ from one rank's by tp's reordered fp32 sums
// (<= 5.2e-7 a step, test_tensor_parallel.cpp); its losses at 10 steps agree to 1.2e-7
// (bound 1e-6, as the AdamW tests'). Along the run Newton-Schulz raises a matrix's small singular
// directions (its quintic's slope at 0 is 3.4445 per iteration), so the final parameters of the
// Muon family differ by up to 1.0e-6 (Muon), 6.2e-7 (PRMuon), 1.1e-7 (Dion3), 9.8e-7 (Muon +
// Ember): bound 5e-6, five times the worst, for another CPU's rounding pattern (the pipeline
// tests' bound for the same amplification, test_pipeline.cpp). SOAP's eigenbases of nearly
// degenerate statistics (a tiny model, 32 rows a step) rotate under those ulps: its loss drifts
// 5e-4 and its parameters 4e-2 by step 10, as one rank's own SOAP does under a 1-ulp change
// (test_pipeline.cpp); its trajectory gets a sanity bound only (1e-2 / 2e-1), the bit-exact
// update is its check.
TEST(TensorParallelOptim, EveryWholeMatrixOptimizerAtTp2GivesOneRanksUpdate) {
  std::vector<std::string> routes;
  for (const std::string& t : optimizers_for(ParamClass::hidden))
    if (!optimizer_registry().get(t).elementwise) routes.push_back(t);
  for (const std::string& t : optimizers_for(ParamClass::embedding))
    if (!optimizer_registry().get(t).elementwise) routes.push_back("muon+" + t);
  ASSERT_GE(routes.size(), 5u);  // dion3, muon, prmuon, soap; muon+ember
  for (const std::string& r : routes) {
    Job job;
    job.model = "llama";
    job.route = r;
    if (r == "soap") expect_matches(job, 1e-2, 2e-1);
    else expect_matches(job, 1e-6, 5e-6);
  }
}

// dp2 x tp2 on four ranks, the GPT-2-style model: a tied head (Ember's table gets the embedding's
// and the head's gradient, summed), a vocabulary of 67 split 33 + 34 (uneven blocks), learned
// positions every tp rank holds whole (Ember steps them in place), and DDP averaging two half
// batches over dp (one more rounding, 6e-8). The update is bit for bit one rank's; the trajectory
// bounds are the tp2 test's (measured: loss 1.1e-7 / 1.2e-7, final parameters 1.1e-6 / 2.2e-7,
// Muon + Ember / Dion3).
TEST(TensorParallelOptim, DataTimesTensorWithATiedUnevenTableGivesOneRanksUpdate) {
  for (const char* r : {"muon+ember", "dion3"}) {
    Job job;
    job.route = r;
    job.dp = 2;
    expect_matches(job, 1e-6, 5e-6);
  }
}

// The Muon family under ZeRO and HSDP over dp, on each rank's tp shard (sharded_muon.h under tp):
// ZeRO cuts the shard's flat buffers into chunks, the matrix's owner in the shard group assembles
// its tp block, the owners of the tp group gather the block's update into the whole matrix and
// orthogonalize it, each keeps its block and hands the chunks back. Checked as above: the update
// against the one-rank optimizer on the same whole tensors (the shadow, bit for bit: the owner
// orthogonalizes the same bits, and momentum, scale and AdamW are element-wise on the chunks),
// and the trajectory against one rank on the same global batch, with the tp2 bounds: tp's
// reordered sums (a few ulps a step) plus the dp reduction of two (HSDP: four) partial batches,
// one more fp32 rounding per element as under DDP (6e-8), amplified along the run by
// Newton-Schulz as derived above (loss 1e-6, final parameters 5e-6).
// - ZeRO-1, GPT-2 style (tied table split 33 + 34: the tp ranks' flat layouts and so their chunk
//   boundaries differ, yet the owners, chosen from the whole matrices, coincide): Muon.
// - ZeRO-2, GPT-2 style: Muon (tp's partial gradients summed before dp's reduce-scatter).
// - ZeRO-3, GPT-2 style: Muon; Llama style (GQA's fused q/k/v and SwiGLU cut per part,
//   column- and row-parallel matrices): PRMuon with period 3, so both its refresh steps (the
//   owner path) and its row steps, whose row norms of the column-parallel matrices are added over
//   tp while the row-parallel ones' rows are whole on their rank.
// - HSDP, 8 ranks: tp2 x replicate 2 x shard 2, Llama style, Muon.
// Without the tp gather (each tp block orthogonalized as if whole) the update differs from the
// shadow's by ~1e-2 and the final parameters by ~1e-1 (measured when the test was written).
TEST(TensorParallelOptim, MuonUnderZeroAndHsdpTimesTensorGivesOneRanksUpdate) {
  struct Case {
    const char *strategy, *model, *route;
    int dp;
  };
  for (const Case& c : {Case{"zero1", "gpt2", "muon", 2}, Case{"zero2", "gpt2", "muon", 2}, Case{"zero3", "gpt2", "muon", 2},
                        Case{"zero3", "llama", "prmuon", 2}, Case{"hsdp", "llama", "muon", 4}}) {
    Job job;
    job.strategy = c.strategy;
    job.model = c.model;
    job.route = c.route;
    job.dp = c.dp;
    expect_matches(job, 1e-6, 5e-6);
  }
}

}  // namespace atl::parallel
