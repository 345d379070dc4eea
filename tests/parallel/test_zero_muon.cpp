// The Muon family under ZeRO-1/2/3 and HSDP (parallel/sharded_muon.h) against the single-rank
// GroupedOptimizer that make_optimizer builds from the same config, on a tiny GPT whose flat
// buffers ZeRO cuts at arbitrary elements; and its checkpoints moving to and from one rank.
//
// Ranks are this binary started again under --gtest_filter=ZeroMuon.RankProgram with the job in
// ATOLL_ZERO_MUON_JOB. Gradients are written straight into the flat gradient buffer: multiples of
// 1/256 in [-1, 1], so the reduction's sum is exact in any order and its average equals the
// reference's (sum, then * 1/world) bit for bit; the comparison then measures the optimizer alone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "comm/tcp_store.h"
#include "core/config.h"
#include "core/threads.h"
#include "harness.h"
#include "models/gpt/gpt.h"
#include "optim/muon.h"
#include "optim/param_groups.h"
#include "parallel/data_parallel.h"
#include "parallel/optim/sharded_muon.h"
#include "tensor/safetensors.h"

namespace atl::parallel {
namespace {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using test::max_rel;
using test::read_floats;
using test::write_floats;

// Kinds: the optimizer config under test.
std::string config_text(const std::string& kind) {
  std::string type = kind == "muon" ? "muon" : "prmuon";
  std::string axis = kind == "prmuon_cols" ? "cols" : "rows";
  std::string row_scale = kind == "prmuon_fit" ? "fit" : "frobenius";
  return "[optim]\ntype = \"" + type + "\"\n" +
         "[optim.muon]\nlr = 0.02\nweight_decay = 0.01\n"
         "[optim.prmuon]\nlr = 0.02\nweight_decay = 0.01\nperiod = 2\naxis = \"" + axis + "\"\nrow_scale = \"" +
         row_scale + "\"\n"
         "[optim.adamw]\nlr = 0.01\nbeta1 = 0.9\nbeta2 = 0.95\neps = 1e-8\nweight_decay = 0.1\n";
}

AdamWConfig adamw_of(Config& c) {
  return {float(c.get_float("optim.adamw.lr", 0)), float(c.get_float("optim.adamw.beta1", 0)),
          float(c.get_float("optim.adamw.beta2", 0)), float(c.get_float("optim.adamw.eps", 0)),
          float(c.get_float("optim.adamw.weight_decay", 0))};
}

ShardedMuonConfig sharded_config(Config& c) {
  ShardedMuonConfig s;
  s.type = c.get_string("optim.type", "");
  if (s.type == "prmuon") s.prm = prmuon_config_from(c, "optim.prmuon");
  else s.prm.muon = muon_config_from(c, "optim.muon");
  s.adamw = adamw_of(c);
  return s;
}

float local_grad(int64_t e, int t, int r) {
  uint64_t h = test::mix((uint64_t(t) << 48) ^ (uint64_t(r) << 40) ^ uint64_t(e));
  return float(int64_t(h % 513) - 256) / 256.f;
}

// The whole gradient buffer: rank r's own (local), or the average over `world` ranks.
void set_grads(nn::GPT& m, int t, int world, int rank, bool local) {
  float* g = m.flat_grads().f32();
  for (int64_t e = 0; e < m.flat_grads().numel(); ++e) {
    if (local) {
      g[e] = local_grad(e, t, rank);
      continue;
    }
    float s = 0.f;
    for (int r = 0; r < world; ++r) s += local_grad(e, t, r);
    g[e] = world == 1 ? s : s * (1.f / float(world));
  }
}

std::vector<float> flatten(const NamedTensors& sd) {
  std::vector<float> out;
  for (auto& [n, t] : sd) {
    Tensor c = t.contiguous();
    out.insert(out.end(), c.f32(), c.f32() + c.numel());
  }
  return out;
}

const StepContext kCtx{0.9f, 0.5f};

// One rank's job (or, with comm null and strategy "single", the reference's).
struct Job {
  std::string strategy = "zero2";
  std::vector<std::string> kinds = {"muon"};
  int hsdp = 0, start = 0, steps = 4;
  std::string load, save, out;
  std::string encode() const {
    std::string k;
    for (auto& s : kinds) k += (k.empty() ? "" : ",") + s;
    return fmt::format("{};{};{};{};{};{};{};{}", strategy, k, hsdp, start, steps, load.empty() ? "-" : load,
                       save.empty() ? "-" : save, out);
  }
  static Job decode(const std::string& s) {
    std::vector<std::string> f;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ';');) f.push_back(x);
    ATOLL_CHECK(f.size() == 8, "bad ATOLL_ZERO_MUON_JOB '{}'", s);
    Job j;
    j.strategy = f[0];
    j.kinds.clear();
    std::stringstream ks(f[1]);
    for (std::string x; std::getline(ks, x, ',');) j.kinds.push_back(x);
    j.hsdp = std::stoi(f[2]);
    j.start = std::stoi(f[3]);
    j.steps = std::stoi(f[4]);
    j.load = f[5] == "-" ? "" : f[5];
    j.save = f[6] == "-" ? "" : f[6];
    j.out = f[7];
    return j;
  }
};


void split_checkpoint(const TensorFile& f, NamedTensors& model, TensorFile& opt) {
  for (auto& [n, t] : f.tensors) {
    if (n.rfind("opt.", 0) == 0) opt.tensors.emplace_back(n.substr(4), t);
    else model.emplace_back(n, t);
  }
}

// Runs one kind through the data-parallel layer (ZeRO with ShardedMuon; or, strategy "single",
// DDP on one process with make_optimizer's GroupedOptimizer, the reference). `worlds[t - start - 1]`
// is how many ranks' gradients step t averages (the reference emulates a job's world size).
std::vector<float> run_kind(comm::Communicator* c, const Job& job, const std::string& kind,
                            const std::vector<int>& worlds) {
  const int world = c ? c->size() : 1, rank = c ? c->rank() : 0;
  Config cfg = Config::parse(config_text(kind), "test");
  nn::GPT model(test::tiny_model());
  model.init_weights(7);
  ParallelConfig pc;
  pc.bucket_mb = 0.004;  // ~1000 floats: many buckets, matrices cut by buckets and by chunks
  pc.hsdp_shard_size = job.hsdp;
  std::unique_ptr<DataParallel> dp;
  if (job.strategy == "single") {
    pc.strategy = "ddp";
    dp = make_data_parallel(model, nullptr, pc, adamw_of(cfg), make_optimizer(cfg, model.param_refs()));
  } else {
    pc.strategy = job.strategy;
    ShardedMuonConfig smc = sharded_config(cfg);
    dp = make_data_parallel(model, c, pc, smc.adamw, nullptr,
                            [smc](nn::Model& m, const FlatLayout& l, comm::Communicator* g) {
                              return std::unique_ptr<ShardedOptimizer>(std::make_unique<ShardedMuon>(m, l, g, smc));
                            });
  }
  if (!job.load.empty()) {
    NamedTensors msd;
    TensorFile opt;
    split_checkpoint(load_safetensors(job.load + "." + kind), msd, opt);
    dp->load_full_state(msd, opt, job.load);
  }
  for (int t = job.start + 1; t <= job.start + job.steps; ++t) {
    dp->zero_grad();
    if (c) set_grads(model, t, world, rank, true);
    else set_grads(model, t, worlds[size_t(t - job.start - 1)], 0, false);
    dp->finish_backward();
    dp->step(kCtx);
  }
  if (auto* sm = dynamic_cast<ShardedMuon*>(&dp->optimizer()); sm && c && world > 1) {
    // The momentum really is sharded: the shard group's pieces partition the hidden matrices.
    int64_t hidden = 0;
    for (auto& p : model.param_refs())
      if (classify_param(p) == ParamClass::hidden) hidden += p.value.numel();
    int shards = job.hsdp > 0 ? job.hsdp : world;
    Tensor n = Tensor::full({1}, float(sm->momentum_elems()));
    c->all_reduce(n, comm::ReduceOp::sum);
    ATOLL_CHECK(int64_t(n.f32()[0]) == hidden * (world / shards), "ranks keep {} momentum elements in all, expected {}",
                int64_t(n.f32()[0]), hidden * (world / shards));
    ATOLL_CHECK(sm->momentum_elems() < hidden, "rank {} keeps the whole momentum ({} elements)", rank, hidden);
  }
  NamedTensors msd, osd;
  dp->full_state(msd, osd);  // collective
  if (!job.save.empty() && rank == 0) {
    NamedTensors all = msd;
    for (auto& [n, t] : osd) all.emplace_back("opt." + n, t);
    save_safetensors(job.save + "." + kind, all);
  }
  return flatten(msd);
}

void run_rank_job(const Job& job, comm::Communicator* c) {
  for (auto& kind : job.kinds)
    write_floats(job.out + "." + kind + "." + std::to_string(c->rank()), run_kind(c, job, kind, {}));
  c->barrier();
}

std::vector<float> reference(const std::string& kind, const std::vector<int>& worlds, int start = 0,
                             const std::string& load = "", const std::string& save = "") {
  Job j;
  j.strategy = "single";
  j.start = start;
  j.steps = int(worlds.size());
  j.load = load;
  j.save = save;
  return run_kind(nullptr, j, kind, worlds);
}

// Starts `world` ranks on the job; returns each kind's rank-0 parameters after checking that
// every rank ended with the same ones. Fails the test on any rank's error.
std::map<std::string, std::vector<float>> run_ranks(int world, Job job, double timeout_s = 60) {
  static int serial = 0;
  std::string tag = fmt::format("/tmp/atoll_zmuon_{}_{}", getpid(), serial++);
  job.out = tag;
  std::vector<int> codes = test::run_rank_programs(world, "ZeroMuon.RankProgram",
                                                   {"ATOLL_ZERO_MUON_JOB=" + job.encode()}, tag, timeout_s);
  return test::collect_kinds(tag, codes, job.kinds, job.strategy);
}

std::vector<float> initial_params() {
  nn::GPT model(test::tiny_model());
  model.init_weights(7);
  return flatten(model.state_dict());
}

}  // namespace

// A rank of the multi-process tests when ATOLL_ZERO_MUON_JOB is set; otherwise ZeRO at world size
// 1 (no communicator: every matrix whole on this rank) against the reference.
TEST(ZeroMuon, RankProgram) {
  if (const char* j = std::getenv("ATOLL_ZERO_MUON_JOB")) {
    set_num_threads(1);
    auto c = comm::make_communicator("gloo", std::chrono::milliseconds(30000));
    run_rank_job(Job::decode(j), c.get());
    return;
  }
  set_num_threads(1);
  for (std::string kind : {"muon", "prmuon", "prmuon_cols", "prmuon_fit"}) {
    Job z;
    z.strategy = "zero3";
    std::vector<float> got = run_kind(nullptr, z, kind, std::vector<int>(4, 1));
    std::vector<float> ref = reference(kind, std::vector<int>(4, 1));
    EXPECT_LE(max_rel(got, ref), 1e-6) << kind;
    EXPECT_GT(max_rel(initial_params(), ref), 1e-3) << kind << ": the reference did not move";
  }
}

// Muon on ZeRO-1/2/3 and HSDP, PRMuon (K = 2: steps 1 and 3 refresh through the owners, 2 and 4
// normalize slices cut by shard boundaries) with rows and columns, on 2, 3 and 4 ranks.
TEST(ZeroMuon, MatchesSingleRank) {
  set_num_threads(1);
  struct Case {
    std::string strategy;
    int world, hsdp;
    std::vector<std::string> kinds;
  };
  const std::vector<Case> cases = {
      {"zero1", 2, 0, {"muon"}},
      {"zero2", 2, 0, {"muon", "prmuon", "prmuon_cols"}},
      {"zero3", 2, 0, {"muon", "prmuon", "prmuon_cols", "prmuon_fit"}},
      {"zero2", 3, 0, {"muon", "prmuon", "prmuon_cols", "prmuon_fit"}},
      {"zero3", 3, 0, {"muon", "prmuon"}},
      {"hsdp", 4, 2, {"muon", "prmuon", "prmuon_fit"}},
  };
  std::map<std::pair<std::string, int>, std::vector<float>> refs;
  for (const Case& cs : cases) {
    Job job;
    job.strategy = cs.strategy;
    job.kinds = cs.kinds;
    job.hsdp = cs.hsdp;
    auto got = run_ranks(cs.world, job);
    ASSERT_EQ(got.size(), cs.kinds.size()) << cs.strategy << " on " << cs.world;
    for (auto& kind : cs.kinds) {
      auto key = std::make_pair(kind, cs.world);
      if (!refs.count(key)) refs[key] = reference(kind, std::vector<int>(4, cs.world));
      double d = max_rel(got[kind], refs[key]);
      std::printf("%-12s %-6s world %d: max relative difference from single-rank %.3g\n", kind.c_str(),
                  cs.strategy.c_str(), cs.world, d);
      EXPECT_LE(d, 1e-6) << kind << " under " << cs.strategy << " on " << cs.world << " ranks";
      EXPECT_GT(max_rel(initial_params(), refs[key]), 1e-3) << kind << ": the reference did not move";
    }
  }
  // The variants are different optimizers, so matching each of them means something.
  EXPECT_GT(max_rel(refs[{"prmuon", 2}], refs[{"muon", 2}]), 1e-4);
  EXPECT_GT(max_rel(refs[{"prmuon_cols", 2}], refs[{"prmuon", 2}]), 1e-4);
  EXPECT_GT(max_rel(refs[{"prmuon_fit", 3}], refs[{"prmuon", 3}]), 1e-4);
}

// Checkpoints hold the single-rank optimizer's names and full shapes: ZeRO-3 on 2 ranks -> one
// rank (make_optimizer's GroupedOptimizer, as DDP holds it), and one rank -> ZeRO-2 on 3 ranks,
// both ending where the uninterrupted run ends.
TEST(ZeroMuon, CheckpointsMoveBetweenWorldSizes) {
  set_num_threads(1);
  const std::vector<std::string> kinds = {"muon", "prmuon", "prmuon_fit"};
  std::string tag = fmt::format("/tmp/atoll_zmuon_ck_{}", getpid());
  Job a;
  a.strategy = "zero3";
  a.kinds = kinds;
  a.steps = 3;
  a.save = tag + ".a";
  ASSERT_EQ(run_ranks(2, a).size(), kinds.size());
  for (auto& kind : kinds) {
    TensorFile f = load_safetensors(a.save + "." + kind);
    int momenta = 0;
    const std::string type = kind == "muon" ? "muon" : "prmuon";
    for (auto& [n, t] : f.tensors)
      momenta += n.rfind("opt." + type + ".", 0) == 0 && n.size() > 9 && n.substr(n.size() - 9) == ".momentum";
    EXPECT_EQ(momenta, 12) << kind << ": one momentum per hidden matrix (3 blocks x 4), under the single-rank names";
    EXPECT_TRUE(f.find("opt.step") && f.find("opt.adamw.step") && f.find("opt." + type + ".step")) << kind;
    std::vector<float> resumed = reference(kind, {1, 1, 1}, 3, a.save);
    std::remove((a.save + "." + kind).c_str());
    EXPECT_LE(max_rel(resumed, reference(kind, {2, 2, 2, 1, 1, 1})), 1e-6) << kind << ": zero3 x2 -> one rank";
  }
  Job b;
  b.strategy = "zero2";
  b.kinds = kinds;
  b.start = 3;
  b.steps = 3;
  b.load = tag + ".b";
  for (auto& kind : kinds) reference(kind, {1, 1, 1}, 0, "", b.load);
  auto got = run_ranks(3, b);
  ASSERT_EQ(got.size(), kinds.size());
  for (auto& kind : kinds) {
    std::remove((b.load + "." + kind).c_str());
    EXPECT_LE(max_rel(got[kind], reference(kind, {1, 1, 1, 3, 3, 3})), 1e-6) << kind << ": one rank -> zero2 x3";
  }
}

}  // namespace atl::parallel
