// Expert parallelism (src/parallel/expert_parallel.h) on 2 and 4 rank processes:
//  - the all-to-all dispatcher equals the all-gather reference, its tile-overlapped form gives
//    bit-identical outputs and gradients, and dispatch -> identity expert ->
//    combine returns x * sum(selected weights), with output and gradients equal to one process
//    holding every expert;
//  - routing every token to one rank's experts (no-drop) makes the all-to-all buffers grow, with
//    the same results;
//  - EP = 2 on 2 ranks (ZeRO-3) and dp2 x ep2 on 4 (HSDP): per-step losses, gradient norms and the
//    final parameters over 10 AdamW steps equal one process's that runs each rank's rows as a
//    micro-batch (1/W each), to 1e-6 relative;
//  - bad layouts are refused before any step;
//  - ep x tp (EpTimesTp): dp_shard 2 x tp 2 with ep 2 on 4 ranks follows one process over 10
//    steps, overlapped or not, under ZeRO-1, ZeRO-3 and (8 ranks) HSDP, and under `atoll train`
//    (ZeRO-1, ZeRO-3) follows one rank and resumes across layouts; the family at tp 2 alone keeps
//    one rank's auxiliary losses.
//
// Why the bound holds on any x86-64 CPU: every rank runs the same rows through the same kernels
// as the one-process reference (routing, attention, norms and head see the same [b, T] batch on
// both), the grouped GEMM computes a row's output and input gradient in a fixed order that does
// not depend on which rows share the call (tests/kernels/test_grouped_gemm.cpp), and the
// dispatchers copy rows, never add them. What differs is only the order of a few sums of per-rank
// gradients (an expert's weight gradient over both sources' rows in one kernel call vs two, the
// data-parallel reduction vs accumulation), each ~1 ulp; AdamW with eps 1e-5 (the data-parallel
// harness's choice) and lr 3e-3 keeps those from being amplified: measured ~4e-8 after 10 steps
// on 2 and on 4 ranks, 25x under 1e-6 (at lr 1e-2 the 4-rank job reached 1.1e-6).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "autograd/ops.h"
#include "core/threads.h"
#include "harness.h"
#include "launch_fixture.h"
#include "models/moe/moe_model.h"
#include "parallel/data_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/tensor_parallel.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace atl;
using namespace atl::parallel;
using namespace atl::parallel::test;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kT = 16, kBatch = 2;
constexpr int kSteps = 10;

nn::MoEModelConfig ep_model(bool drop = false) {
  nn::MoEModelConfig c = nn::MoEModelConfig::preset("moe-tiny");
  c.attn.block_size = kT;
  c.moe.n_experts = 4;
  c.moe.aux_loss_coef = 0.05;
  c.moe.z_loss_coef = 0.01;
  c.moe.drop_tokens = drop;
  c.moe.capacity_factor = 1.0;
  return c;
}

// Row j of step s's global batch, the same whatever the world size.
Tensor rows(int step, int64_t first, int64_t n, bool targets) {
  std::vector<int32_t> v(size_t(n * kT));
  // Random tokens; the target is a fixed function of the token (a bigram the model can learn).
  for (int64_t r = 0; r < n; ++r)
    for (int64_t t = 0; t < kT; ++t) {
      const int32_t tok = int32_t(mix(uint64_t(step) * 100003u + uint64_t(first + r) * 101u + uint64_t(t)) % 257u);
      v[size_t(r * kT + t)] = targets ? (tok * 31 + 7) % 257 : tok;
    }
  return Tensor::from_vector_i32(v, {n, kT});
}

const AdamWConfig kAdam{3e-3f, 0.9f, 0.95f, 1e-5f, 0.1f};

struct Trace {
  std::vector<float> loss, gnorm, params;
};

// The whole model's parameters by name (sharded experts gathered, appended after the dense ones,
// so the order is the names').
std::vector<float> full_params(DataParallel& dp, ExpertShards* ep = nullptr, TensorParallel* tp = nullptr) {
  std::vector<std::pair<std::string, Tensor>> sd, opt;
  dp.full_state(sd, opt);
  if (tp) tp->full_state(sd, opt);  // this rank's tp pieces -> the whole tensors
  if (ep) ep->full_state(sd, opt);
  std::map<std::string, Tensor> by(sd.begin(), sd.end());
  std::vector<float> v;
  for (auto& [n, t] : by) {
    auto x = t.to_vector();
    v.insert(v.end(), x.begin(), x.end());
  }
  return v;
}

// Steps [start, end) of a run; it loads the whole model's state (weights and AdamW) first when
// `load` is set and saves it after when `save` is (files <path>.model and <path>.optim).
struct Segment {
  int start = 0, end = kSteps;
  std::string load, save;
};

void save_state(const std::string& path, std::vector<std::pair<std::string, Tensor>> sd,
                std::vector<std::pair<std::string, Tensor>> opt) {
  save_safetensors(path + ".model", sd);
  save_safetensors(path + ".optim", opt);
}

// One process: each of `world` ranks' rows as a micro-batch with backward seed 1/world.
Trace reference(int world, bool drop, const Segment& seg = {}, const AdamWConfig& adam = kAdam) {
  set_num_threads(1);
  nn::MoEModel model(ep_model(drop));
  model.init_weights(5);
  ParallelConfig pc;
  auto dp = make_data_parallel(model, nullptr, pc, adam);
  if (!seg.load.empty()) {
    TensorFile m = load_safetensors(seg.load + ".model"), o = load_safetensors(seg.load + ".optim");
    dp->load_full_state(m.tensors, o, seg.load);
  }
  Trace tr;
  for (int s = seg.start; s < seg.end; ++s) {
    dp->zero_grad();
    double loss = 0;
    for (int r = 0; r < world; ++r) {
      Tensor l = model.loss(rows(s, r * kBatch, kBatch, false), rows(s, r * kBatch, kBatch, true));
      loss += l.item() / world;
      backward(l, 1.f / float(world));
    }
    dp->finish_backward();
    tr.loss.push_back(float(loss));
    tr.gnorm.push_back(float(dp->grad_norm()));
    dp->step({1.f, 1.f});
  }
  tr.params = full_params(*dp);
  if (!seg.save.empty()) {
    std::vector<std::pair<std::string, Tensor>> sd, opt;
    dp->full_state(sd, opt);
    save_state(seg.save, sd, opt);
  }
  return tr;
}

std::string env_or(const char* k, const std::string& d) {
  const char* v = std::getenv(k);
  return v ? v : d;
}

// A rank of the training job: ATOLL_EP_JOB = "<dp_replicate> <ep> <dispatcher> <drop> <tag>
// [<start> <end> <load|-> <save|->]" (a Segment).
void job_rank(const std::string& spec) {
  std::istringstream in(spec);
  int64_t rep = 1, ep = 1;
  std::string kind, tag, load = "-", save = "-";
  int drop = 0, start = 0, end = kSteps;
  in >> rep >> ep >> kind >> drop >> tag >> start >> end >> load >> save;
  set_num_threads(1);
  auto comm = comm::make_communicator("gloo");
  const int64_t W = comm->size();
  MeshShape shape;
  shape.dp_replicate = rep;
  shape.dp_shard = W / rep;
  shape.ep = ep;
  Mesh mesh(comm.get(), shape);
  std::unique_ptr<nn::Model> owned = std::make_unique<nn::MoEModel>(ep_model(drop != 0));
  const int64_t full_numel = owned->num_params();
  Config cfg = Config::parse("[parallel]\nep_dispatcher = \"" + kind + "\"\n", "ep job");
  auto shards = apply_expert_parallel(cfg, owned, mesh, comm.get());  // this rank's experts only
  nn::Model& model = *owned;
  model.init_weights(5);
  ParallelConfig pc;
  pc.strategy = shape.strategy(3);
  pc.mesh = shape;
  pc.bucket_mb = 0.004;
  if (pc.strategy == "hsdp") pc.hsdp_shard_size = int(shape.dp_shard);
  auto dp = make_data_parallel(model, comm.get(), pc, kAdam, nullptr, {}, &mesh);
  shards->attach(kAdam, dp->world());
  if (load != "-") {  // this rank's experts out of the whole model's state, then the dense rest
    TensorFile m = load_safetensors(load + ".model"), o = load_safetensors(load + ".optim");
    shards->local_state(m.tensors, o, load);
    dp->load_full_state(m.tensors, o, load);
  }
  Trace tr;
  const int r = comm->rank();
  for (int s = start; s < end; ++s) {
    dp->zero_grad();
    shards->zero_grad();
    Tensor l = model.loss(rows(s, r * kBatch, kBatch, false), rows(s, r * kBatch, kBatch, true));
    const double lv = l.item();
    backward(l);
    dp->finish_backward();
    shards->finish_backward();
    tr.loss.push_back(float(dp->average(lv)));
    tr.gnorm.push_back(float(shards->grad_norm(dp->grad_norm())));
    dp->step({1.f, 1.f});
    shards->step({1.f, 1.f});
  }
  tr.params = full_params(*dp, shards.get());
  if (save != "-") {
    std::vector<std::pair<std::string, Tensor>> sd, opt;
    dp->full_state(sd, opt);
    shards->full_state(sd, opt);  // collective: every rank gathers
    if (r == 0) save_state(save, sd, opt);
  }
  // Storage: the experts' values, gradients and AdamW state on this rank are 1/ep of the whole
  // model's, and the flat buffers data parallelism works on hold none of them.
  int64_t expert_numel = 0;
  for (nn::Parameter* q : dynamic_cast<nn::ExpertModel&>(model).sharded_expert_parameters())
    expert_numel += shape_numel(q->shape);
  write_floats(tag + ".storage." + std::to_string(r),
               {float(shards->bytes()), float(shards->full_bytes()), float(model.num_params()), float(expert_numel),
                float(full_numel)});
  write_floats(tag + ".loss." + std::to_string(r), tr.loss);
  write_floats(tag + ".gnorm." + std::to_string(r), tr.gnorm);
  write_floats(tag + ".params." + std::to_string(r), tr.params);
  std::printf("rank %d: %s, dispatcher %s, strategy %s, expert bytes %lld of %lld\n", r, shape.describe().c_str(),
              shards->dispatcher().name().c_str(), dp->name().c_str(), (long long)shards->bytes(),
              (long long)shards->full_bytes());
}

// ep x tp (4 ranks: dp_shard 2 x tp 2, ep 2 over dp_shard; ZeRO-1 over dp, sequence parallelism):
// the tp pair of a data-parallel rank shares its rows, each tp rank routing its half of the tokens
// over the ep group of its tp coordinate. AdamW as the tensor-parallel tests take it (lr 1e-3, eps
// 1e-3: the bound's reasoning, EpTimesTp below).
const AdamWConfig kAdamTp{1e-3f, 0.9f, 0.95f, 1e-3f, 0.1f};

// ATOLL_EP_TP_JOB = "<dispatcher> <overlap 0|1> <tag> [<strategy> <dp_replicate>]" (zero1 and 1
// when left out; zero3, or hsdp with dp_replicate 2 on 8 ranks).
void ep_tp_rank(const std::string& spec) {
  std::istringstream in(spec);
  std::string kind, tag, strategy = "zero1";
  int overlap = 0;
  int64_t rep = 1;
  in >> kind >> overlap >> tag >> strategy >> rep;
  set_num_threads(1);
  auto comm = comm::make_communicator("gloo");
  MeshShape shape;
  shape.dp_replicate = rep;
  shape.dp_shard = 2;
  shape.tp = comm->size() / (2 * rep);
  shape.ep = 2;
  Mesh mesh(comm.get(), shape);
  std::unique_ptr<nn::Model> owned = std::make_unique<nn::MoEModel>(ep_model());
  Config cfg = Config::parse("[parallel]\nep_dispatcher = \"" + kind + "\"\nep_overlap = " +
                             (overlap ? "true" : "false") + "\n", "ep x tp job");
  auto shards = apply_expert_parallel(cfg, owned, mesh, comm.get());  // this ep rank's experts
  auto tp = TensorParallel::apply(owned, mesh, /*sequence_parallel=*/true);  // its tp shard
  shards->rebind(*owned);
  nn::Model& model = *owned;
  model.init_weights(5);
  ParallelConfig pc;
  pc.strategy = strategy;
  pc.mesh = shape;
  pc.bucket_mb = 0.004;
  if (strategy == "hsdp") pc.hsdp_shard_size = int(shape.dp_shard);
  auto dp = make_data_parallel(model, data_parallel_comm(mesh), pc, kAdamTp, nullptr, {}, &mesh);
  tp->attach(*dp);  // ZeRO-3 / HSDP: tp's partial gradients summed per unit, before its reduce-scatter
  shards->attach(kAdamTp, dp->world());
  const int64_t d = mesh.coord("dp_replicate") * shape.dp_shard + mesh.coord("dp_shard");
  Trace tr;
  for (int s = 0; s < kSteps; ++s) {
    dp->zero_grad();
    shards->zero_grad();
    Tensor l = model.loss(rows(s, d * kBatch, kBatch, false), rows(s, d * kBatch, kBatch, true));
    const double lv = l.item();
    backward(l);
    dp->finish_backward();
    shards->finish_backward();
    tp->finish_backward();
    tr.loss.push_back(float(dp->average(lv)));
    tr.gnorm.push_back(float(shards->grad_norm(tp->grad_norm(*dp))));
    dp->step({1.f, 1.f});
    shards->step({1.f, 1.f});
  }
  tr.params = full_params(*dp, shards.get(), tp.get());
  const int r = comm->rank();
  write_floats(tag + ".loss." + std::to_string(r), tr.loss);
  write_floats(tag + ".gnorm." + std::to_string(r), tr.gnorm);
  write_floats(tag + ".params." + std::to_string(r), tr.params);
  write_floats(tag + ".layout." + std::to_string(r),
               {float(mesh.coord("tp")), float(mesh.coord("ep")), float(shards->ep_size()), float(model.num_params())});
  write_floats(tag + ".dp." + std::to_string(r), {float(dp->world()), float(mesh.coord("dp_replicate"))});
  std::printf("rank %d: %s, tp coordinate %lld, ep coordinate %lld, dispatcher %s%s, strategy %s\n", r,
              shape.describe().c_str(), (long long)mesh.coord("tp"), (long long)mesh.coord("ep"),
              shards->dispatcher().name().c_str(), overlap ? " (overlapped)" : "", dp->name().c_str());
}

struct Root : nn::Module {
  explicit Root(const nn::MoEConfig& c) : Module("") {
    layer = child<nn::MoELayer>("mlp", c);
    materialize();
  }
  nn::MoELayer* layer;
};

nn::MoEConfig layer_config() {
  nn::MoEConfig c;
  c.dim = 12;
  c.n_experts = 4;
  c.top_k = 2;
  c.expert_ffn = 8;
  c.norm_topk = false;  // so that sum(selected weights) is not 1 and the check can fail
  return c;
}

// Out, dx and dgate of the identity-expert layer (expert = copy) or the real one, under dispatcher d.
std::vector<float> layer_run(Root& root, nn::ExpertDispatcher* d, comm::Communicator* comm, const Tensor& x0,
                             const Tensor& dy, bool identity, std::vector<float>* sum_w = nullptr) {
  nn::MoELayer& L = *root.layer;
  L.set_dispatcher(d);
  root.zero_grad();
  Tensor x = x0.clone();
  set_requires_grad(x, true, "x");
  Tensor y = identity ? L.forward_with(x, [](const Tensor& r, const std::vector<int64_t>&, int64_t) { return r; })
                      : L(x);
  backward(ops::dot_const(y, dy));
  std::vector<float> v = y.to_vector();
  auto gx = grad_of(x).to_vector(), gg = L.gate->grad.to_vector();
  v.insert(v.end(), gx.begin(), gx.end());
  v.insert(v.end(), gg.begin(), gg.end());
  if (!identity) {  // an expert's gradient lives on its rank: summed over ranks before comparing
    for (nn::Parameter* p : {L.w_gate_up, L.w_down}) {
      Tensor g = p->grad.clone();
      if (comm) comm->all_reduce(g);
      auto gs = g.to_vector();
      v.insert(v.end(), gs.begin(), gs.end());
    }
  }
  if (sum_w) {
    NoGradGuard ng;
    nn::Routing rt = L.route(x0);
    *sum_w = std::vector<float>(size_t(x0.size(0)), 0.f);
    auto w = rt.weights.to_vector();
    for (int64_t n = 0; n < x0.size(0); ++n)
      for (int64_t j = 0; j < 2; ++j) (*sum_w)[size_t(n)] += w[size_t(n * 2 + j)];
  }
  L.set_dispatcher(nullptr);
  return v;
}

// A rank of the dispatcher test: ATOLL_EP_DISPATCH = "<skew> <tag>".
void dispatch_rank(const std::string& spec) {
  std::istringstream in(spec);
  int skew = 0;
  std::string tag;
  in >> skew >> tag;
  set_num_threads(1);
  auto comm = comm::make_communicator("gloo");
  const int r = comm->rank();
  Root root(layer_config());
  Tensor fv = root.flat_values();
  Rng(11, 0).fill_normal(fv, 0.f, 0.4f);
  const int64_t N = 10 + 3 * r;  // ranks hold different token counts
  Tensor x = Tensor::empty({N, 12}), dy = Tensor::empty({N, 12});
  Rng(20 + uint64_t(r), 0).fill_normal(x, 0.f, 1.f);
  Rng(40 + uint64_t(r), 0).fill_normal(dy, 0.f, 1.f);
  if (skew) {  // every token prefers experts 2 and 3 (rank 1's): rank 1 receives every row
    for (int64_t i = 0; i < N * 12; ++i) x.f32()[i] = std::fabs(x.f32()[i]) + 0.5f;
    float* g = root.layer->gate->value.f32();
    for (int64_t c = 0; c < 12; ++c) g[2 * 12 + c] = 2.f, g[3 * 12 + c] = 1.5f;
  }
  auto a2a = make_expert_dispatcher("all_to_all", comm.get()), ag = make_expert_dispatcher("all_gather", comm.get());
  // The overlap at its default grain (forward and backward tiled), with the backward's exchanges
  // plain, and grains that split each (source, expert) block into several tiles sent one per
  // message, or coalesced into uneven runs of consecutive tiles (both directions).
  std::vector<std::unique_ptr<nn::ExpertDispatcher>> tiled;
  for (OverlapGrain g : {OverlapGrain{}, OverlapGrain{64, 4, false}, OverlapGrain{1, 0}, OverlapGrain{2, 3},
                         OverlapGrain{3, 1}, OverlapGrain{1, 0, false}})
    tiled.push_back(make_expert_dispatcher("all_to_all", comm.get(), /*overlap=*/true, g));
  std::vector<float> sum_w;
  for (bool identity : {true, false}) {
    auto va = layer_run(root, a2a.get(), comm.get(), x, dy, identity, identity ? &sum_w : nullptr);
    auto vg = layer_run(root, ag.get(), comm.get(), x, dy, identity);
    auto vl = layer_run(root, nullptr, comm.get(), x, dy, identity);  // one process, every expert local
    const std::string k = identity ? "identity" : "experts";
    // Output, dx and the router's gradient elementwise; the experts' weight gradients (summed
    // over ranks, in another order than one process sums them) in relative L2.
    const size_t exact = size_t(N * 12 * 2 + 4 * 12);
    auto head = [&](const std::vector<float>& v) { return std::vector<float>(v.begin(), v.begin() + exact); };
    auto tail = [&](const std::vector<float>& v) { return std::vector<float>(v.begin() + exact, v.end()); };
    const double d_ag = max_rel(va, vg), d_local = std::max(max_rel(head(va), head(vl)),
                                                            identity ? 0.0 : rel_diff(tail(va), tail(vl)));
    if (d_ag > 1e-6) std::printf("FAIL %s: all_to_all vs all_gather %g\n", k.c_str(), d_ag);
    if (d_local > 1e-6) std::printf("FAIL %s: all_to_all vs local %g\n", k.c_str(), d_local);
    if (identity) {
      double worst = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t c = 0; c < 12; ++c)
          worst = std::max(worst, double(std::fabs(va[size_t(n * 12 + c)] - x.f32()[n * 12 + c] * sum_w[size_t(n)])));
      if (worst > 1e-6) std::printf("FAIL identity: out != x * sum(w), off by %g\n", worst);
    }
    float d_tiled = 0;  // tile-overlapped vs plain: bit-identical outputs and gradients
    if (!identity) {
      for (size_t g = 0; g < tiled.size(); ++g) {
        auto vt = layer_run(root, tiled[g].get(), comm.get(), x, dy, false);
        float d = 0;
        for (size_t i = 0; i < va.size(); ++i) d = std::max(d, std::fabs(vt[i] - va[i]));
        if (d != 0) std::printf("FAIL experts: tile-overlapped (grain %zu) vs plain differ by %g\n", g, double(d));
        d_tiled = std::max(d_tiled, d);
      }
    }
    Tensor worst = Tensor::from_vector({float(d_ag), float(d_local), d_tiled}, {3});
    comm->all_reduce(worst, comm::ReduceOp::max);  // the same on every rank
    write_floats(tag + "." + k + "." + std::to_string(r), worst.to_vector());
  }
  // Every rank decides growth from the same count matrix: the count must agree.
  write_floats(tag + ".growths." + std::to_string(r), std::vector<float>{float(dispatcher_buffer_growths(*a2a))});
  std::printf("rank %d: growths %lld\n", r, (long long)dispatcher_buffer_growths(*a2a));
}

struct Scratch {
  fs::path root = fs::temp_directory_path() / ("atoll_ep_" + std::to_string(getpid()));
  Scratch() { fs::create_directories(root); }
  ~Scratch() { fs::remove_all(root); }
};

void expect_rel(const std::vector<float>& a, const std::vector<float>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_LT(rel_diff(a, b), tol) << what;
}

// A small corpus prepared with `atoll data prepare` into s.root/data.
void prepare_corpus(const Scratch& s) {
  prepare_word_corpus(s.root, {"experts", "route", "tokens", "to", "ranks", "and", "back", "again", "each", "step"}, 777);
}

std::vector<float> run_losses(const Scratch& s, const std::string& run) {
  std::vector<float> v;
  for (auto& rec : read_metrics((s.root / run / "metrics.jsonl").string())) v.push_back(float(rec["loss"]));
  return v;
}

// Tensor names and shapes of one file of a run's step-4 checkpoint.
std::map<std::string, Shape> step4_names_shapes(const Scratch& s, const std::string& run, const char* file) {
  std::map<std::string, Shape> m;
  for (auto& [n, t] : load_safetensors((s.root / run / "checkpoints/step_00000004" / file).string()).tensors)
    m[n] = t.shape();
  return m;
}

void job_equals_reference(int world, int64_t rep, const std::string& kind) {
  Scratch s;
  const std::string tag = (s.root / "job").string();
  auto codes = run_rank_programs(world, "ExpertParallel.RankProgram",
                                 {"ATOLL_EP_JOB=" + std::to_string(rep) + " 2 " + kind + " 0 " + tag}, tag, 120);
  auto got = collect_kinds(tag, codes, {"loss", "gnorm", "params", "storage"}, kind);
  ASSERT_EQ(got.size(), 4u);
  Trace ref = reference(world, false);
  ASSERT_EQ(got["loss"].size(), size_t(kSteps));
  EXPECT_LT(ref.loss.back(), ref.loss.front()) << "the reference did not train";
  const std::string what = std::to_string(world) + " ranks, ep 2, " + kind;
  for (int s = 0; s < kSteps; ++s)
    std::printf("step %d: loss %.9g vs %.9g, grad norm %.9g vs %.9g\n", s + 1, got["loss"][size_t(s)], ref.loss[size_t(s)],
                got["gnorm"][size_t(s)], ref.gnorm[size_t(s)]);
  std::printf("rel: loss %g, grad norm %g, params %g\n", rel_diff(got["loss"], ref.loss), rel_diff(got["gnorm"], ref.gnorm), rel_diff(got["params"], ref.params));
  expect_rel(got["loss"], ref.loss, 1e-6, what + ": losses");
  expect_rel(got["gnorm"], ref.gnorm, 1e-6, what + ": gradient norms");
  expect_rel(got["params"], ref.params, 1e-6, what + ": final parameters");
  // Per-rank expert storage (values, gradients, AdamW moments) is the whole model's / ep, and the
  // dense part plus this rank's experts plus the other ranks' experts is the whole model.
  const auto& st = got["storage"];
  ASSERT_GE(st.size(), 5u);
  EXPECT_GT(st[0], 0.f);
  EXPECT_EQ(st[0] * 2, st[1]) << what << ": expert bytes on a rank vs the whole model's";
  EXPECT_EQ(st[2] + 2 * st[3], st[4]) << what << ": dense + 2 ranks' experts != the whole model";
}

}  // namespace

// A rank of the multi-process tests when one of ATOLL_EP_TRAIN_CFG, ATOLL_EP_JOB, ATOLL_EP_DISPATCH is set.
TEST(ExpertParallel, RankProgram) {
  if (const char* c = std::getenv("ATOLL_EP_TRAIN_CFG")) {
    Config cfg = Config::load(c);
    Trainer(cfg).run(std::getenv("ATOLL_EP_TRAIN_RESUME") != nullptr);
    return;
  }
  if (const char* j = std::getenv("ATOLL_EP_JOB")) return job_rank(j);
  if (const char* j = std::getenv("ATOLL_EP_TP_JOB")) return ep_tp_rank(j);
  if (const char* d = std::getenv("ATOLL_EP_DISPATCH")) return dispatch_rank(d);
  // Run directly (not as a rank): the one-process reference the rank jobs are held to is itself
  // deterministic, bit for bit, so a mismatch there is the parallelism's.
  Trace a = reference(2, true), b = reference(2, true);
  EXPECT_EQ(a.loss, b.loss);
  EXPECT_EQ(a.params, b.params);
  EXPECT_LT(a.loss.back(), a.loss.front()) << "the drop-mode reference did not train";
}

TEST(ExpertParallel, AllToAllEqualsAllGatherTileOverlapIsIdenticalAndIdentityExpertsReturnWeightedInput) {
  for (int skew : {0, 1}) {
    Scratch s;
    const std::string tag = (s.root / "disp").string();
    auto codes = run_rank_programs(2, "ExpertParallel.RankProgram",
                                   {"ATOLL_EP_DISPATCH=" + std::to_string(skew) + " " + tag}, tag, 60);
    for (int r = 0; r < 2; ++r) {
      const std::string log = read_file(tag + ".log" + std::to_string(r));
      EXPECT_EQ(log.find("FAIL"), std::string::npos) << "skew " << skew << " rank " << r << ":\n" << log;
    }
    auto got = collect_kinds(tag, codes, {"identity", "experts", "growths"}, "dispatch");
    ASSERT_EQ(got.size(), 3u);
    for (const char* k : {"identity", "experts"}) {
      EXPECT_LE(got[k][0], 1e-6) << k << ": all_to_all vs all_gather";
      EXPECT_LE(got[k][1], 1e-6) << k << ": all_to_all vs one process";
    }
    EXPECT_EQ(got["experts"][2], 0.f) << "tile-overlapped and plain all-to-all differ";
    // Every row to rank 1: a pair carries all of rank 0's rows, past an even share's buffer.
    if (skew) {
      EXPECT_GT(got["growths"][0], 0.f) << "the skewed routing did not grow the buffers";
    }
  }
}

TEST(ExpertParallel, Ep2OnTwoRanksFollowsOneProcess) { job_equals_reference(2, 1, "all_to_all"); }

// The whole model's state saved by an ep2 job (experts gathered) resumes in one process holding
// every expert, and one process's resumes under ep2 (each rank taking its experts' slices): both
// continue exactly as the uninterrupted one-process run (the parity bound above).
TEST(ExpertParallel, StateResumesAcrossEpLayouts) {
  Scratch s;
  const Trace whole = reference(2, false);
  const std::string half = (s.root / "half").string();
  {  // ep2 for steps 0-4, saved; one process for 5-9
    const std::string tag = (s.root / "a").string();
    auto codes = run_rank_programs(2, "ExpertParallel.RankProgram",
                                   {"ATOLL_EP_JOB=1 2 all_to_all 0 " + tag + " 0 5 - " + half}, tag, 120);
    auto got = collect_kinds(tag, codes, {"loss"}, "ep2 -> 1, first half");
    ASSERT_EQ(got["loss"].size(), 5u);
    TensorFile m = load_safetensors(half + ".model");
    const nn::MoEModelConfig c = ep_model();
    const Tensor* up = m.find("model.layers.1.mlp.experts.gate_up_proj");
    ASSERT_NE(up, nullptr) << "the saved state lacks the stacked experts under their name";
    EXPECT_EQ(up->shape(), (Shape{c.moe.n_experts, c.attn.n_embd, 2 * c.moe.expert_ffn}));
    Segment seg;
    seg.start = 5;
    seg.load = half;
    Trace rest = reference(2, false, seg);
    std::vector<float> tail(whole.loss.begin() + 5, whole.loss.end());
    expect_rel(rest.loss, tail, 1e-6, "ep2 -> 1: losses of steps 6-10");
    expect_rel(rest.params, whole.params, 1e-6, "ep2 -> 1: final parameters");
  }
  {  // one process for 0-4, saved; ep2 for 5-9
    Segment seg;
    seg.end = 5;
    seg.save = half + "1";
    reference(2, false, seg);
    const std::string tag = (s.root / "b").string();
    auto codes = run_rank_programs(2, "ExpertParallel.RankProgram",
                                   {"ATOLL_EP_JOB=1 2 all_to_all 0 " + tag + " 5 10 " + half + "1 -"}, tag, 120);
    auto got = collect_kinds(tag, codes, {"loss", "params"}, "1 -> ep2, second half");
    std::vector<float> tail(whole.loss.begin() + 5, whole.loss.end());
    expect_rel(got["loss"], tail, 1e-6, "1 -> ep2: losses of steps 6-10");
    expect_rel(got["params"], whole.params, 1e-6, "1 -> ep2: final parameters");
  }
}

TEST(ExpertParallel, Dp2TimesEp2OnFourRanksFollowsOneProcess) { job_equals_reference(4, 2, "all_to_all"); }

TEST(ExpertParallel, BadLayoutsAreRefusedBeforeAnyStep) {
  nn::MoEModelConfig c = ep_model();
  c.moe.n_experts = 3;
  c.moe.top_k = 2;
  nn::MoEModel m(c);
  MeshShape shape;
  shape.dp_shard = 2;
  shape.ep = 2;
  try {
    check_expert_layout(shape, m);
    ADD_FAILURE() << "3 experts over ep = 2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_experts = 3 is not divisible"), std::string::npos) << e.what();
  }
  // A family without experts.
  nn::GPT gpt(tiny_model());
  EXPECT_THROW(check_expert_layout(shape, gpt), Error);
  shape.ep = 1;
  EXPECT_NO_THROW(check_expert_layout(shape, gpt));
}

// `atoll train`'s trainer with [parallel] dp_shard = 2, ep = 2 on 2 ranks, both dispatchers:
// the same losses as one rank at the doubled batch (the balance loss is off: it is not a mean over
// tokens, so one rank's over 2b rows differs from the mean of two ranks' over b), and the two
// dispatchers and the tile-overlapped all-to-all bit-identical.
TEST(ExpertParallel, TrainerRunsEp2OnTwoRanks) {
  Scratch s;
  ASSERT_NO_FATAL_FAILURE(prepare_corpus(s));
  auto config = [&](const std::string& run, int batch, const std::string& parallel, int steps = 4) {
    std::ostringstream c;
    c << "[run]\ndir = \"" << (s.root / run).string() << "\"\n[data]\ndir = \"" << (s.root / "data").string()
      << "\"\nauto_prepare = false\n[model]\nfamily = \"moe\"\npreset = \"moe-tiny\"\nn_experts = 4\n"
      << "aux_loss_coef = 0.0\n[train]\nsteps = " << steps << "\nbatch_size = " << batch
      << "\nseq_len = 16\nwarmup_steps = 1\nthreads = 1\n[optim.adamw]\nlr = 3e-3\neps = 1e-5\n[eval]\nevery = 0\n"
      << "[sample]\nevery = 0\n[checkpoint]\nevery = 0\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n"
      << (parallel.empty() ? "" : "[parallel]\n" + parallel);
    fs::path p = s.root / (run + ".toml");
    std::ofstream(p) << c.str();
    return p;
  };
  auto losses = [&](const std::string& run) { return run_losses(s, run); };
  {
    Config one = Config::load(config("one", 8, "").string());
    Trainer(one).run(false);
  }
  std::map<std::string, std::vector<float>> got;
  for (std::string kind : {"all_to_all", "all_gather", "overlap"}) {
    const std::string disp = kind == "overlap" ? "all_to_all\"\nep_overlap = true\n" : kind + "\"\n";
    fs::path cfg = config(kind, 4, "dp_shard = 2\nep = 2\nep_dispatcher = \"" + disp);
    const std::string tag = (s.root / kind).string();
    auto codes = run_rank_programs(2, "ExpertParallel.RankProgram", {"ATOLL_EP_TRAIN_CFG=" + cfg.string()}, tag, 120);
    for (size_t r = 0; r < codes.size(); ++r)
      ASSERT_EQ(codes[r], 0) << kind << " rank " << r << ":\n" << read_file(tag + ".log" + std::to_string(r));
    const std::string log = read_file(tag + ".log0");
    EXPECT_NE(log.find("ep=2"), std::string::npos) << log;
    got[kind] = losses(kind);
    ASSERT_EQ(got[kind].size(), 4u);
  }
  EXPECT_EQ(got["all_to_all"], got["all_gather"]);
  EXPECT_EQ(got["all_to_all"], got["overlap"]) << "tile-overlapped training differs from the plain all-to-all";
  // One rank at 2b vs two at b: the data-parallel tests' bound (float summation order in the mean).
  const auto one = losses("one");
  ASSERT_EQ(one.size(), 4u);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(got["all_to_all"][i], one[i], 1e-4) << "step " << i + 1;

  // The ep2 checkpoint holds the whole model under the stated names (the experts stacked
  // [E, C, 2F] and [E, F, C], gathered from both ranks): the same names and shapes as one
  // process's, weights and AdamW state alike.
  auto names_shapes = [&](const std::string& run, const char* file) { return step4_names_shapes(s, run, file); };
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(names_shapes("all_to_all", f), names_shapes("one", f)) << f;
  EXPECT_EQ(names_shapes("all_to_all", "model.safetensors")["model.layers.1.mlp.experts.down_proj"],
            (Shape{4, 16, 32}))
      << "moe-tiny's stacked experts (4 of them at n_experts = 4)";
  // Resumed across layouts: ep2's checkpoint in one process, one process's under ep2; steps 5-6
  // follow the one-process run continued (the bound above: 1 rank at 2b vs 2 at b).
  auto seed_from = [&](const std::string& from, const std::string& run) {
    fs::create_directories(s.root / run / "checkpoints");
    fs::copy(s.root / from / "checkpoints/step_00000004", s.root / run / "checkpoints/step_00000004",
             fs::copy_options::recursive);
  };
  seed_from("one", "one6");
  seed_from("all_to_all", "one_from_ep");
  seed_from("one", "ep_from_one");
  for (const char* run : {"one6", "one_from_ep"}) {
    Config c = Config::load(config(run, 8, "", 6).string());
    Trainer(c).run(true);
  }
  {
    fs::path cfg = config("ep_from_one", 4, "dp_shard = 2\nep = 2\n", 6);
    const std::string tag = (s.root / "ep_from_one").string() + "_log";
    auto codes = run_rank_programs(2, "ExpertParallel.RankProgram",
                                   {"ATOLL_EP_TRAIN_CFG=" + cfg.string(), "ATOLL_EP_TRAIN_RESUME=1"}, tag, 120);
    for (size_t r = 0; r < codes.size(); ++r)
      ASSERT_EQ(codes[r], 0) << "ep_from_one rank " << r << ":\n" << read_file(tag + ".log" + std::to_string(r));
    EXPECT_NE(read_file(tag + ".log0").find("resumed from"), std::string::npos) << read_file(tag + ".log0");
  }
  const auto cont = losses("one6");
  ASSERT_EQ(cont.size(), 2u) << "the one-process run continued for steps 5-6";
  for (const char* run : {"one_from_ep", "ep_from_one"}) {
    const auto l = losses(run);
    ASSERT_EQ(l.size(), 2u) << run;
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(l[i], cont[i], 1e-4) << run << " step " << i + 5;
  }
}

// Found on the way (models/gpt): an untied lm_head is a root parameter, first in the flat buffer,
// so ZeRO-3 counted it in the lower root and released it after the embedding lookup; ranks other
// than its shard's owner then computed logits from freed memory. A Llama-style GPT (untied head)
// on 2 ZeRO-3 ranks must follow one rank at the doubled batch. (Uses this file's rank program.)
TEST(Zero3UntiedHead, LlamaTinyOnTwoRanksFollowsOneRank) {
  Scratch s;
  ASSERT_NO_FATAL_FAILURE(prepare_corpus(s));
  auto config = [&](const std::string& run, int batch, const std::string& parallel) {
    std::ostringstream c;
    c << "[run]\ndir = \"" << (s.root / run).string() << "\"\n[data]\ndir = \"" << (s.root / "data").string()
      << "\"\nauto_prepare = false\n[model]\npreset = \"llama-tiny\"\n[train]\nsteps = 3\nbatch_size = " << batch
      << "\nseq_len = 16\nwarmup_steps = 1\nthreads = 1\n[optim.adamw]\nlr = 3e-3\neps = 1e-5\n[eval]\nevery = 0\n"
      << "[sample]\nevery = 0\n[checkpoint]\nevery = 0\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n"
      << (parallel.empty() ? "" : "[parallel]\n" + parallel);
    fs::path p = s.root / (run + ".toml");
    std::ofstream(p) << c.str();
    return p;
  };
  {
    Config one = Config::load(config("one", 8, "").string());
    Trainer(one).run(false);
  }
  fs::path cfg = config("zero3", 4, "dp_shard = 2\n");
  const std::string tag = (s.root / "zero3").string();
  auto codes = run_rank_programs(2, "ExpertParallel.RankProgram", {"ATOLL_EP_TRAIN_CFG=" + cfg.string()}, tag, 120);
  for (size_t r = 0; r < codes.size(); ++r)
    ASSERT_EQ(codes[r], 0) << "rank " << r << ":\n" << read_file(tag + ".log" + std::to_string(r));
  const auto one = run_losses(s, "one"), z3 = run_losses(s, "zero3");
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(z3.size(), 3u);
  // Before the fix step 1 was already off by 5e-3 (5.5405 vs 5.5452 on the fortunes corpus).
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(z3[i], one[i], 1e-4) << "step " << i + 1;
}

// ep x tp on 4 ranks (dp_shard 2 x tp 2, ep 2 over dp_shard, ZeRO-1, sequence parallelism):
// per-step losses, gradient norms and the final parameters over 10 AdamW steps equal one process
// running each data-parallel rank's rows as a micro-batch. The routing, the balance and z losses
// (their counts summed over tp) and the experts see exactly the reference's tokens; what tensor
// parallelism adds is the tp tests' reordering of fp32 sums (row-parallel K sums in halves, the
// vocabulary softmax in halves, a shared input's gradient summed over ranks: a few ulps each), so
// the bound and the optimizer settings are theirs (test_tensor_parallel.cpp: 1e-6 with AdamW lr
// 1e-3, eps 1e-3, which keeps AdamW from amplifying ulps of near-zero gradients). The overlapped
// dispatcher gives the plain one's results bit for bit.
TEST(EpTimesTp, Ep2Tp2OnFourRanksFollowsOneProcess) {
  Scratch s;
  std::map<std::string, std::map<std::string, std::vector<float>>> got;
  for (int overlap : {0, 1}) {
    const std::string k = overlap ? "overlap" : "plain", tag = (s.root / k).string();
    auto codes = run_rank_programs(4, "ExpertParallel.RankProgram",
                                   {"ATOLL_EP_TP_JOB=all_to_all " + std::to_string(overlap) + " " + tag}, tag, 180);
    got[k] = collect_kinds(tag, codes, {"loss", "gnorm", "params"}, "ep2 x tp2 " + k);
    ASSERT_EQ(got[k].size(), 3u) << k;
    // The layout: rank r = dp * 2 + tp has tp coordinate r % 2 and ep coordinate r / 2, an ep
    // group of 2, and a tree of its tp shard's parameters (fewer than the whole dense model's).
    nn::MoEModel whole(ep_model());
    for (int r = 0; r < 4; ++r) {
      const auto lay = read_floats(tag + ".layout." + std::to_string(r));
      ASSERT_EQ(lay.size(), 4u) << "rank " << r;
      EXPECT_EQ(lay[0], float(r % 2)) << "rank " << r << ": tp coordinate";
      EXPECT_EQ(lay[1], float(r / 2)) << "rank " << r << ": ep coordinate";
      EXPECT_EQ(lay[2], 2.f) << "rank " << r << ": ep group size";
      EXPECT_LT(lay[3], float(whole.num_params())) << "rank " << r << " holds the whole dense model, not its tp shard";
    }
  }
  const Trace ref = reference(2, false, {}, kAdamTp);
  ASSERT_EQ(got["plain"]["loss"].size(), size_t(kSteps));
  EXPECT_LT(ref.loss.back(), ref.loss.front()) << "the reference did not train";
  for (int i = 0; i < kSteps; ++i)
    std::printf("step %d: loss %.9g vs %.9g, grad norm %.9g vs %.9g\n", i + 1, got["plain"]["loss"][size_t(i)],
                ref.loss[size_t(i)], got["plain"]["gnorm"][size_t(i)], ref.gnorm[size_t(i)]);
  std::printf("rel: loss %g, grad norm %g, params %g\n", rel_diff(got["plain"]["loss"], ref.loss),
              rel_diff(got["plain"]["gnorm"], ref.gnorm), rel_diff(got["plain"]["params"], ref.params));
  expect_rel(got["plain"]["loss"], ref.loss, 1e-6, "ep2 x tp2: losses");
  expect_rel(got["plain"]["gnorm"], ref.gnorm, 1e-6, "ep2 x tp2: gradient norms");
  expect_rel(got["plain"]["params"], ref.params, 1e-6, "ep2 x tp2: final parameters");
  for (const char* k : {"loss", "gnorm", "params"})
    EXPECT_EQ(got["overlap"][k], got["plain"][k]) << "tile-overlapped ep x tp differs from the plain all-to-all: " << k;
}

// ep x tp under ZeRO-3 (dp_shard 2 x tp 2, 4 ranks) and HSDP (dp_replicate 2 x dp_shard 2 x tp 2,
// 8 ranks), ep 2 over dp_shard: each tp rank's shard is cut into ZeRO-3 units and sharded over its
// dp group; tp's partial gradients (router, norms: replicated, each tp rank's from its own tokens)
// are summed over tp per unit just before the unit's reduce-scatter (Zero::set_before_reduce),
// while the experts live outside the flat buffers and are summed only over the ranks with the same
// ep coordinate (both tp ranks of both replicas). Held to one process running each of the 2 (4)
// data-parallel ranks' rows as a micro-batch, over 10 steps.
//
// The bound is EpTimesTp.Ep2Tp2OnFourRanksFollowsOneProcess's (1e-6): ZeRO-3 adds no reordering
// over ZeRO-1 (a 2-rank reduce-scatter computes a + b, as the all-reduce does; the per-unit tp sum
// adds the same two terms as the after-backward one), and HSDP sums the 4 ranks' gradients as
// (a + b) + (c + d) where the reference accumulates ((a + b) + c) + d: one more rounding of each
// gradient entry (2^-24 relative to the largest partial), which AdamW at eps 1e-3 passes on
// undamped to ~1e-7 of an update, far below 1e-6 after 10 steps. The overlapped dispatcher under
// ZeRO-3 stays bit-identical to the plain one (the same kernel calls on the same rows).
// (The per-unit tp sum is wired as the trainer wires it. At this model's layout the after-backward
// tp sum would give the same numbers, measured with tp->attach removed: a sum is linear, and the
// tp ranks' chunks of the units holding partial parameters line up. The GPT-2 tp x ZeRO-3 test,
// with its uneven vocabulary, is the one where they do not: test_tensor_parallel.cpp.)
TEST(EpTimesTp, UnderZero3AndHsdpFollowsOneProcess) {
  Scratch s;
  struct Run {
    const char* name;
    int world;
    const char* strategy;
    int rep, overlap;
  };
  std::map<std::string, std::map<std::string, std::vector<float>>> got;
  for (const Run& run : {Run{"zero3", 4, "zero3", 1, 0}, Run{"zero3_overlap", 4, "zero3", 1, 1},
                         Run{"hsdp", 8, "hsdp", 2, 0}}) {
    const std::string tag = (s.root / run.name).string();
    auto codes = run_rank_programs(run.world, "ExpertParallel.RankProgram",
                                   {"ATOLL_EP_TP_JOB=all_to_all " + std::to_string(run.overlap) + " " + tag + " " +
                                    run.strategy + " " + std::to_string(run.rep)},
                                   tag, 240);
    // The strategy ran (rank 0's log names it) over the 2 (4) data-parallel ranks.
    const std::string log = codes[0] == 0 ? read_file(tag + ".log0") : std::string();
    got[run.name] = collect_kinds(tag, codes, {"loss", "gnorm", "params"}, std::string("ep2 x tp2 ") + run.name);
    ASSERT_EQ(got[run.name].size(), 3u) << run.name;
    EXPECT_NE(log.find(std::string("strategy ") + (run.rep > 1 ? "hsdp" : "zero3")), std::string::npos) << log;
    // Rank r = (replica * 2 + shard) * 2 + tp: tp coordinate r % 2, ep coordinate (the shard's) r / 2 % 2.
    for (int r = 0; r < run.world; ++r) {
      const auto lay = read_floats(tag + ".layout." + std::to_string(r)), dp = read_floats(tag + ".dp." + std::to_string(r));
      ASSERT_EQ(lay.size(), 4u) << run.name << " rank " << r;
      ASSERT_EQ(dp.size(), 2u) << run.name << " rank " << r;
      EXPECT_EQ(lay[0], float(r % 2)) << run.name << " rank " << r << ": tp coordinate";
      EXPECT_EQ(lay[1], float(r / 2 % 2)) << run.name << " rank " << r << ": ep coordinate";
      EXPECT_EQ(lay[2], 2.f) << run.name << " rank " << r << ": ep group size";
      EXPECT_EQ(dp[0], float(run.world / 2)) << run.name << " rank " << r << ": data-parallel ranks";
      EXPECT_EQ(dp[1], float(r / 4)) << run.name << " rank " << r << ": replica";
    }
  }
  const Trace ref2 = reference(2, false, {}, kAdamTp), ref4 = reference(4, false, {}, kAdamTp);
  EXPECT_LT(ref2.loss.back(), ref2.loss.front()) << "the reference did not train";
  for (const char* name : {"zero3", "hsdp"}) {
    const Trace& ref = std::string(name) == "hsdp" ? ref4 : ref2;
    auto& g = got[name];
    ASSERT_EQ(g["loss"].size(), size_t(kSteps)) << name;
    for (int i = 0; i < kSteps; ++i)
      std::printf("%s step %d: loss %.9g vs %.9g, grad norm %.9g vs %.9g\n", name, i + 1, g["loss"][size_t(i)],
                  ref.loss[size_t(i)], g["gnorm"][size_t(i)], ref.gnorm[size_t(i)]);
    std::printf("%s rel: loss %g, grad norm %g, params %g\n", name, rel_diff(g["loss"], ref.loss),
                rel_diff(g["gnorm"], ref.gnorm), rel_diff(g["params"], ref.params));
    const std::string what = std::string("ep2 x tp2 under ") + name;
    expect_rel(g["loss"], ref.loss, 1e-6, what + ": losses");
    expect_rel(g["gnorm"], ref.gnorm, 1e-6, what + ": gradient norms");
    expect_rel(g["params"], ref.params, 1e-6, what + ": final parameters");
  }
  for (const char* k : {"loss", "gnorm", "params"})
    EXPECT_EQ(got["zero3_overlap"][k], got["zero3"][k]) << "tile-overlapped ep x tp x ZeRO-3 differs from plain: " << k;
}

// `atoll train`'s trainer on 4 ranks with [parallel] dp_shard = 2, tp = 2, ep = 2 (ZeRO-1): the
// same losses as one rank at the doubled batch (balance loss off, as in TrainerRunsEp2OnTwoRanks:
// it is not a mean over tokens), its checkpoint the whole model's (one process's names and
// shapes), and that checkpoint resumed in one process follows the one-process run continued.
TEST(EpTimesTp, TrainerRunsDp2Tp2Ep2AndResumesOnOneRank) {
  Scratch s;
  ASSERT_NO_FATAL_FAILURE(prepare_corpus(s));
  auto config = [&](const std::string& run, int batch, const std::string& parallel, int steps = 4) {
    std::ostringstream c;
    c << "[run]\ndir = \"" << (s.root / run).string() << "\"\n[data]\ndir = \"" << (s.root / "data").string()
      << "\"\nauto_prepare = false\n[model]\nfamily = \"moe\"\npreset = \"moe-tiny\"\nn_experts = 4\n"
      << "aux_loss_coef = 0.0\n[train]\nsteps = " << steps << "\nbatch_size = " << batch
      << "\nseq_len = 16\nwarmup_steps = 1\nthreads = 1\n[optim.adamw]\nlr = 3e-3\neps = 1e-5\n[eval]\nevery = 0\n"
      << "[sample]\nevery = 0\n[checkpoint]\nevery = 0\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n"
      << (parallel.empty() ? "" : "[parallel]\n" + parallel);
    fs::path p = s.root / (run + ".toml");
    std::ofstream(p) << c.str();
    return p;
  };
  {
    Config one = Config::load(config("one", 8, "").string());
    Trainer(one).run(false);
  }
  fs::path cfg = config("eptp", 4, "strategy = \"zero1\"\ndp_shard = 2\ntp = 2\nep = 2\n");
  const std::string tag = (s.root / "eptp").string() + "_log";
  auto codes = run_rank_programs(4, "ExpertParallel.RankProgram", {"ATOLL_EP_TRAIN_CFG=" + cfg.string()}, tag, 180);
  for (size_t r = 0; r < codes.size(); ++r)
    ASSERT_EQ(codes[r], 0) << "rank " << r << ":\n" << read_file(tag + ".log" + std::to_string(r));
  const std::string log = read_file(tag + ".log0");
  EXPECT_NE(log.find("tp=2"), std::string::npos) << log;
  EXPECT_NE(log.find("ep=2"), std::string::npos) << log;
  const auto one = run_losses(s, "one"), eptp = run_losses(s, "eptp");
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(eptp.size(), 4u);
  // One rank at 2b vs (2 dp x 2 tp) at b: float summation order (the data-parallel tests' bound).
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(eptp[i], one[i], 1e-4) << "step " << i + 1;
  auto names_shapes = [&](const std::string& run, const char* file) { return step4_names_shapes(s, run, file); };
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(names_shapes("eptp", f), names_shapes("one", f)) << f;
  // Resumed on one rank: steps 5-6 from the ep x tp checkpoint and from one process's own.
  for (const auto& [from, run] : {std::pair<std::string, std::string>{"one", "one6"}, {"eptp", "one_from_eptp"}}) {
    fs::create_directories(s.root / run / "checkpoints");
    fs::copy(s.root / from / "checkpoints/step_00000004", s.root / run / "checkpoints/step_00000004",
             fs::copy_options::recursive);
    Config c = Config::load(config(run, 8, "", 6).string());
    Trainer(c).run(true);
  }
  const auto cont = run_losses(s, "one6"), resumed = run_losses(s, "one_from_eptp");
  ASSERT_EQ(cont.size(), 2u);
  ASSERT_EQ(resumed.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(resumed[i], cont[i], 1e-4) << "step " << i + 5;
}

// `atoll train` with [parallel] strategy = "zero3", dp_shard = 2, tp = 2, ep = 2 on 4 ranks (the
// trainer's order: the tp shard's ZeRO-3 units with the per-unit tp sum, the experts outside
// them): the losses of one rank at the doubled batch (the bound and the balance loss as in the
// ZeRO-1 test above), a checkpoint with one process's names and shapes, and both resumes: that
// checkpoint in one process, and one process's checkpoint in the ep x tp x ZeRO-3 job (each rank
// taking its tp pieces, its experts and its ZeRO-3 shard), steps 5-6 following one process's run
// continued.
TEST(EpTimesTp, TrainerRunsUnderZero3AndResumesAcrossLayouts) {
  Scratch s;
  ASSERT_NO_FATAL_FAILURE(prepare_corpus(s));
  auto config = [&](const std::string& run, int batch, const std::string& parallel, int steps = 4) {
    std::ostringstream c;
    c << "[run]\ndir = \"" << (s.root / run).string() << "\"\n[data]\ndir = \"" << (s.root / "data").string()
      << "\"\nauto_prepare = false\n[model]\nfamily = \"moe\"\npreset = \"moe-tiny\"\nn_experts = 4\n"
      << "aux_loss_coef = 0.0\n[train]\nsteps = " << steps << "\nbatch_size = " << batch
      << "\nseq_len = 16\nwarmup_steps = 1\nthreads = 1\n[optim.adamw]\nlr = 3e-3\neps = 1e-5\n[eval]\nevery = 0\n"
      << "[sample]\nevery = 0\n[checkpoint]\nevery = 0\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n"
      << (parallel.empty() ? "" : "[parallel]\n" + parallel);
    fs::path p = s.root / (run + ".toml");
    std::ofstream(p) << c.str();
    return p;
  };
  const std::string layout = "strategy = \"zero3\"\ndp_shard = 2\ntp = 2\nep = 2\n";
  auto run4 = [&](const std::string& run, int steps, bool resume) {
    fs::path cfg = config(run, 4, layout, steps);
    const std::string tag = (s.root / run).string() + "_log";
    std::vector<std::string> env = {"ATOLL_EP_TRAIN_CFG=" + cfg.string()};
    if (resume) env.push_back("ATOLL_EP_TRAIN_RESUME=1");
    auto codes = run_rank_programs(4, "ExpertParallel.RankProgram", env, tag, 180);
    for (size_t r = 0; r < codes.size(); ++r)
      EXPECT_EQ(codes[r], 0) << run << " rank " << r << ":\n" << read_file(tag + ".log" + std::to_string(r));
    return codes[0] == 0 ? read_file(tag + ".log0") : std::string();
  };
  {
    Config one = Config::load(config("one", 8, "").string());
    Trainer(one).run(false);
  }
  const std::string log = run4("z3", 4, false);
  EXPECT_NE(log.find("zero3 over 2 ranks"), std::string::npos) << log;
  EXPECT_NE(log.find("tp=2"), std::string::npos) << log;
  EXPECT_NE(log.find("ep=2"), std::string::npos) << log;
  const auto one = run_losses(s, "one"), z3 = run_losses(s, "z3");
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(z3.size(), 4u);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(z3[i], one[i], 1e-4) << "step " << i + 1;
  auto names_shapes = [&](const std::string& run, const char* file) { return step4_names_shapes(s, run, file); };
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(names_shapes("z3", f), names_shapes("one", f)) << f;
  auto seed_from = [&](const std::string& from, const std::string& run) {
    fs::create_directories(s.root / run / "checkpoints");
    fs::copy(s.root / from / "checkpoints/step_00000004", s.root / run / "checkpoints/step_00000004",
             fs::copy_options::recursive);
  };
  seed_from("one", "one6");
  seed_from("z3", "one_from_z3");
  seed_from("one", "z3_from_one");
  for (const char* run : {"one6", "one_from_z3"}) {
    Config c = Config::load(config(run, 8, "", 6).string());
    Trainer(c).run(true);
  }
  EXPECT_NE(run4("z3_from_one", 6, true).find("resumed from"), std::string::npos);
  const auto cont = run_losses(s, "one6");
  ASSERT_EQ(cont.size(), 2u) << "the one-process run continued for steps 5-6";
  for (const char* run : {"one_from_z3", "z3_from_one"}) {
    const auto l = run_losses(s, run);
    ASSERT_EQ(l.size(), 2u) << run;
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(l[i], cont[i], 1e-4) << run << " step " << i + 5;
  }
}

// The MoE family tensor-parallel alone (tp 2, no ep: every expert on both ranks, in the module
// tree, replicated over tp): the tp pair shares one batch, each routing its half of the tokens,
// so with the balance and z losses on (their counts and token total summed over tp) the losses
// equal one rank's on the same batch, to the tp tests' float-reordering bound.
TEST(EpTimesTp, Tp2WithoutEpFollowsOneRankWithTheAuxiliaryLosses) {
  Scratch s;
  ASSERT_NO_FATAL_FAILURE(prepare_corpus(s));
  auto config = [&](const std::string& run, const std::string& parallel) {
    std::ostringstream c;
    c << "[run]\ndir = \"" << (s.root / run).string() << "\"\n[data]\ndir = \"" << (s.root / "data").string()
      << "\"\nauto_prepare = false\n[model]\nfamily = \"moe\"\npreset = \"moe-tiny\"\nn_experts = 4\n"
      << "aux_loss_coef = 0.05\nz_loss_coef = 0.01\n[train]\nsteps = 4\nbatch_size = 4\nseq_len = 16\n"
      << "warmup_steps = 1\nthreads = 1\n[optim.adamw]\nlr = 1e-3\neps = 1e-3\n[eval]\nevery = 0\n"
      << "[sample]\nevery = 0\n[checkpoint]\nevery = 0\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n"
      << (parallel.empty() ? "" : "[parallel]\n" + parallel);
    fs::path p = s.root / (run + ".toml");
    std::ofstream(p) << c.str();
    return p;
  };
  {
    Config one = Config::load(config("one", "").string());
    Trainer(one).run(false);
  }
  fs::path cfg = config("tp", "tp = 2\n");
  const std::string tag = (s.root / "tp").string() + "_log";
  auto codes = run_rank_programs(2, "ExpertParallel.RankProgram", {"ATOLL_EP_TRAIN_CFG=" + cfg.string()}, tag, 120);
  for (size_t r = 0; r < codes.size(); ++r)
    ASSERT_EQ(codes[r], 0) << "rank " << r << ":\n" << read_file(tag + ".log" + std::to_string(r));
  EXPECT_NE(read_file(tag + ".log0").find("tp=2"), std::string::npos) << read_file(tag + ".log0");
  const auto one = read_metrics((s.root / "one" / "metrics.jsonl").string()),
             tp = read_metrics((s.root / "tp" / "metrics.jsonl").string());
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(tp.size(), 4u);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_NEAR(double(tp[i]["loss"]), double(one[i]["loss"]), 1e-6 * double(one[i]["loss"])) << "step " << i + 1;
    // Without the tp sums each rank would score its half's balance loss (an E/(k N) over half
    // the tokens with half the counts: a different number), so this pins them.
    EXPECT_NEAR(double(tp[i]["moe_balance_loss"]), double(one[i]["moe_balance_loss"]), 1e-6) << "step " << i + 1;
    EXPECT_NEAR(double(tp[i]["moe_z_loss"]), double(one[i]["moe_z_loss"]), 1e-6) << "step " << i + 1;
  }
}

// ep x tp without sequence parallelism would have every tp rank route and compute the same
// tokens: refused before the first step, naming the key (4 ranks: the mesh needs them).
TEST(EpTimesTp, WithoutSequenceParallelismIsRefusedNamingTheKey) {
  Scratch s;
  fs::path cfg = s.root / "bad.toml";
  std::ofstream(cfg) << "[run]\ndir = \"" << (s.root / "run").string() << "\"\n[data]\ndir = \""
                     << (s.root / "nodata").string() << "\"\nauto_prepare = false\n[model]\nfamily = \"moe\"\n"
                     << "preset = \"moe-tiny\"\nn_experts = 4\n[train]\nsteps = 1\nbatch_size = 4\nseq_len = 16\n"
                     << "[parallel]\nstrategy = \"zero1\"\ndp_shard = 2\ntp = 2\nep = 2\nsequence_parallel = false\n";
  const std::string tag = (s.root / "bad").string();
  auto codes = run_rank_programs(4, "ExpertParallel.RankProgram", {"ATOLL_EP_TRAIN_CFG=" + cfg.string()}, tag, 120);
  for (size_t r = 0; r < codes.size(); ++r) {
    EXPECT_NE(codes[r], 0) << "rank " << r << " accepted ep x tp without sequence parallelism";
    const std::string log = read_file(tag + ".log" + std::to_string(r));
    EXPECT_NE(log.find("needs parallel.sequence_parallel = true (" + cfg.string() + ":"), std::string::npos) << log;
    EXPECT_EQ(log.find("step     1"), std::string::npos) << "a step ran:\n" << log;
  }
}
