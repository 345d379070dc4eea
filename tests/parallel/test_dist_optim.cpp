// The distributed optimizers (parallel/muon_owner, prmuon_sharded, dion3_dist) against their
// single-rank counterparts (optim/muon, periodic_row_muon, dion3) on small matrices.
//
// Multi-process runs start this binary again under --gtest_filter=DistOptim.RankProgram with the
// job in ATOLL_DIST_OPTIM_JOB and torchrun's variables: that test then plays one rank (a gloo
// communicator) and writes its final parameters. Run without the job variable, the same test runs
// every job kind in-process at world size 1 against the single-rank reference.
//
// Gradients are multiples of 1/256 in [-1, 1], so every rank's sum is exact in any order and the
// reference's average (sum, then * 1/world, as comm's avg) is bit-identical to the reduction's.
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <cstdlib>
#include <fstream>
#include <gtest/gtest.h>
#include <sstream>

#include "comm/tcp_store.h"
#include "core/threads.h"
#include "harness.h"
#include "parallel/optim/dion3_dist.h"
#include "parallel/optim/muon_owner.h"
#include "parallel/optim/prmuon_sharded.h"
#include "tensor/rng.h"


namespace atl::parallel {
namespace {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using test::max_rel;
using test::read_floats;
using test::write_floats;

const std::vector<Shape> kShapes = {{24, 16}, {16, 40}, {32, 32}, {8, 12}, {41, 24}, {12, 20}, {7, 33}};

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's local gradient of matrix i at step t (1-based), a multiple of 1/256.
float local_grad(size_t i, int64_t e, int t, int r) {
  uint64_t h = mix((uint64_t(t) << 48) ^ (uint64_t(r) << 40) ^ (uint64_t(i) << 32) ^ uint64_t(e));
  return float(int64_t(h % 513) - 256) / 256.f;
}

struct Model {
  std::vector<Tensor> values, grads;
  std::vector<ParamRef> refs;
  Model() {
    Rng rng(1234);
    for (size_t i = 0; i < kShapes.size(); ++i) {
      values.push_back(Tensor::zeros(kShapes[i]));
      rng.fill_normal(values.back(), 0.f, 0.1f);
      grads.push_back(Tensor::zeros(kShapes[i]));
      refs.push_back({"h." + std::to_string(i) + ".w", values.back(), grads.back()});
    }
  }
  // local: this rank's own gradient; else the average over `world` ranks.
  void set_grads(int t, int world, int rank, bool local) {
    for (size_t i = 0; i < grads.size(); ++i) {
      float* g = grads[i].f32();
      for (int64_t e = 0; e < grads[i].numel(); ++e) {
        if (local) {
          g[e] = local_grad(i, e, t, rank);
        } else {
          float s = 0.f;
          for (int r = 0; r < world; ++r) s += local_grad(i, e, t, r);
          g[e] = world == 1 ? s : s * (1.f / float(world));
        }
      }
    }
  }
  std::vector<float> flat() const {
    std::vector<float> v;
    for (auto& t : values) v.insert(v.end(), t.f32(), t.f32() + t.numel());
    return v;
  }
  void save(NamedTensors& out) const {
    for (auto& p : refs) out.emplace_back("param." + p.name, p.value.clone());
  }
  void load(const TensorFile& f) {
    for (auto& p : refs) p.value.copy_from(f.get("param." + p.name));
  }
};

MuonConfig muon_cfg() {
  MuonConfig c;
  c.lr = 0.02f;
  c.weight_decay = 0.01f;
  return c;
}
PeriodicRowMuonConfig prm_cfg(const std::string& kind) {
  PeriodicRowMuonConfig c;
  c.muon = muon_cfg();
  c.period = 3;
  c.fit_scale = kind == "prmuon_fit";  // row_scale = "fit": the owners fit the row step's scale
  return c;
}
Dion3Config dion_cfg(const std::string& kind) {
  Dion3Config c;
  c.fraction = kind == "dion3l1" ? 1.f : 0.25f;
  c.select = kind == "dion3g" ? "neurons" : "rows";
  c.weight_decay = kind == "dion3l" ? 0.f : 0.01f;  // dion3l: unchanged rows are exactly unchanged
  return c;
}

// Gradients of the distributed variants: local (reduced inside the optimizer) or averaged.
bool local_grads(const std::string& kind) { return kind == "muon_red" || kind == "prmuon" || kind == "prmuon_fit"; }

std::unique_ptr<Optimizer> make_dist(const std::string& kind, std::vector<ParamRef> ps, comm::Communicator* c) {
  if (kind == "muon" || kind == "muon_red") return std::make_unique<MuonOwner>(ps, MuonOwnerConfig{muon_cfg(), kind == "muon_red"}, c);
  if (kind == "prmuon" || kind == "prmuon_rep" || kind == "prmuon_fit") {
    PrMuonShardedConfig pc{prm_cfg(kind), kind != "prmuon_rep", 700};  // small buckets: several per step
    return std::make_unique<PrMuonSharded>(ps, pc, c);
  }
  if (kind == "dion3g" || kind == "dion3g_rows")
    return std::make_unique<Dion3Dist>(ps, dion_cfg(kind), SelectScope::global, c);
  if (kind == "dion3l" || kind == "dion3l1") return std::make_unique<Dion3Dist>(ps, dion_cfg(kind), SelectScope::local, c);
  fail("unknown job kind {}", kind);
}

std::unique_ptr<Optimizer> make_single(const std::string& kind, std::vector<ParamRef> ps) {
  if (kind == "muon" || kind == "muon_red") return std::make_unique<Muon>(ps, muon_cfg());
  if (kind == "prmuon" || kind == "prmuon_rep" || kind == "prmuon_fit")
    return std::make_unique<PeriodicRowMuon>(ps, prm_cfg(kind));
  return std::make_unique<Dion3>(ps, dion_cfg(kind));
}

// One job of one rank: optionally load "<load>.<kind>", run steps (start, start + steps], save
// "<save>.<kind>" (collective; rank 0 writes), write the parameters to "<out>.<kind>.<rank>".
struct Job {
  std::vector<std::string> kinds;
  int start = 0, steps = 4;
  std::string load, save, out;
  std::string encode() const {
    std::string k;
    for (auto& s : kinds) k += (k.empty() ? "" : ",") + s;
    return fmt::format("{};{};{};{};{};{}", k, start, steps, load.empty() ? "-" : load, save.empty() ? "-" : save,
                       out);
  }
  static Job decode(const std::string& s) {
    std::vector<std::string> f;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, ';');) f.push_back(x);
    ATOLL_CHECK(f.size() == 6, "bad ATOLL_DIST_OPTIM_JOB '{}'", s);
    Job j;
    std::stringstream ks(f[0]);
    for (std::string x; std::getline(ks, x, ',');) j.kinds.push_back(x);
    j.start = std::stoi(f[1]);
    j.steps = std::stoi(f[2]);
    j.load = f[3] == "-" ? "" : f[3];
    j.save = f[4] == "-" ? "" : f[4];
    j.out = f[5];
    return j;
  }
};


void run_rank_job(const Job& job, comm::Communicator* c) {
  const int world = c ? c->size() : 1, rank = c ? c->rank() : 0;
  for (auto& kind : job.kinds) {
    Model m;
    auto opt = make_dist(kind, m.refs, c);
    if (!job.load.empty()) {
      TensorFile f = load_safetensors(job.load + "." + kind);
      m.load(f);
      opt->load_state(f, "opt.");
    }
    for (int t = job.start + 1; t <= job.start + job.steps; ++t) {
      m.set_grads(t, world, rank, local_grads(kind));
      opt->step({0.9f, 0.5f});
    }
    if (auto* prm = dynamic_cast<PrMuonSharded*>(opt.get())) {  // the momentum really is sharded
      int64_t bound = 0;
      for (auto& sh : kShapes) bound += (sh[0] + world - 1) / world * sh[1];
      ATOLL_CHECK(prm->state_elems() <= bound, "prmuon keeps {} momentum elements, more than its row shard {}",
                  prm->state_elems(), bound);
    }
    NamedTensors st;
    opt->save_state(st, "opt.");  // collective on every rank
    if (!job.save.empty() && rank == 0) {
      m.save(st);
      save_safetensors(job.save + "." + kind, st);
    }
    write_floats(job.out + "." + kind + "." + std::to_string(rank), m.flat());
  }
  if (c) c->barrier();
}

// The single-rank reference: steps (0, n] with the average over worlds[t - 1] ranks at step t;
// optionally saving after `save_at` steps.
std::vector<float> reference(const std::string& kind, const std::vector<int>& worlds, int save_at = -1,
                             const std::string& save = "") {
  Model m;
  auto opt = make_single(kind, m.refs);
  for (int t = 1; t <= int(worlds.size()); ++t) {
    m.set_grads(t, worlds[size_t(t - 1)], 0, false);
    opt->step({0.9f, 0.5f});
    if (t == save_at) {
      NamedTensors st;
      opt->save_state(st, "opt.");
      m.save(st);
      save_safetensors(save + "." + kind, st);
    }
  }
  return m.flat();
}

// Starts `world` ranks of this binary on the job; fails the test on any error. Returns each
// kind's rank-0 parameters (after checking every rank ended with the same ones).
std::map<std::string, std::vector<float>> run_ranks(int world, Job job, double timeout_s = 40) {
  static int serial = 0;
  std::string tag = fmt::format("/tmp/atoll_doptim_{}_{}", getpid(), serial++);
  job.out = tag;
  std::vector<int> codes = test::run_rank_programs(world, "DistOptim.RankProgram",
                                                   {"ATOLL_DIST_OPTIM_JOB=" + job.encode()}, tag, timeout_s);
  return test::collect_kinds(tag, codes, job.kinds, "distributed optimizers");
}

}  // namespace

// A rank of the multi-process tests when ATOLL_DIST_OPTIM_JOB is set; otherwise every job kind at
// world size 1 (no communicator) against the single-rank optimizer.
TEST(DistOptim, RankProgram) {
  if (const char* j = std::getenv("ATOLL_DIST_OPTIM_JOB")) {
    set_num_threads(1);
    auto c = comm::make_communicator("gloo", std::chrono::milliseconds(20000));
    run_rank_job(Job::decode(j), c.get());
    return;
  }
  Job job;
  job.kinds = {"muon", "muon_red", "prmuon", "prmuon_rep", "prmuon_fit", "dion3g", "dion3g_rows", "dion3l1"};
  job.steps = 5;
  job.out = fmt::format("/tmp/atoll_doptim_w1_{}", getpid());
  run_rank_job(job, nullptr);
  for (auto& kind : job.kinds) {
    std::string f = job.out + "." + kind + ".0";
    std::vector<float> p = read_floats(f);
    std::remove(f.c_str());
    EXPECT_EQ(max_rel(p, reference(kind, std::vector<int>(5, 1))), 0.0) << kind;
  }
}

TEST(DistOptim, LptBalancesCost) {
  EXPECT_EQ(assign_owners_lpt({5, 4, 3, 3, 3}, 2), (std::vector<int>{0, 1, 1, 0, 1}));
  EXPECT_EQ(assign_owners_lpt({1, 1, 1}, 1), (std::vector<int>{0, 0, 0}));
  // GPT-2-like mix: the spread of the loads never exceeds the largest single cost.
  std::vector<double> cost;
  for (int l = 0; l < 6; ++l)
    for (double c : {3.0, 1.0, 4.0, 4.0}) cost.push_back(c * (1 + 0.01 * l));
  for (int w : {2, 3, 4, 5}) {
    auto own = assign_owners_lpt(cost, w);
    std::vector<double> load(size_t(w), 0.0);
    for (size_t i = 0; i < cost.size(); ++i) load[size_t(own[i])] += cost[i];
    auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    EXPECT_LE(*hi - *lo, 4.06) << "world " << w;
  }
  OwnerPacking p({10, 20, 30}, {1, 0, 1}, 2);
  EXPECT_EQ(p.chunk, 40);
  EXPECT_EQ(p.offset, (std::vector<int64_t>{40, 0, 50}));
  EXPECT_NEAR(p.padding_fraction(), 20.0 / 80.0, 1e-12);
}

// Muon ownership (replicated and owner-reduced gradients), sharded PRMuon over refresh steps
// (K = 3, 5 steps: refreshes at 1 and 4), and global-scope Dion3 equal the single-rank result.
TEST(DistOptim, MatchesSingleRankOnTwoAndThreeRanks) {
  const int steps = 5;
  for (int world : {2, 3}) {
    Job job;
    job.kinds = world == 2 ? std::vector<std::string>{"muon", "muon_red", "prmuon", "prmuon_rep", "prmuon_fit", "dion3g",
                                                      "dion3g_rows", "dion3l1"}
                           : std::vector<std::string>{"muon", "muon_red", "prmuon", "prmuon_fit", "dion3g"};
    job.steps = steps;
    auto got = run_ranks(world, job);
    ASSERT_EQ(got.size(), job.kinds.size());
    for (auto& kind : job.kinds) {
      auto ref = reference(kind, std::vector<int>(steps, world));
      double d = max_rel(got[kind], ref);
      std::printf("%-12s world %d: max relative difference from single-rank %.3g\n", kind.c_str(), world, d);
      EXPECT_LE(d, 1e-6) << kind << " on " << world << " ranks";
      // The parameters moved, so the comparison has teeth.
      Model init;
      EXPECT_GT(max_rel(init.flat(), ref), 1e-3) << kind;
    }
  }
}

// Local-scope Dion3 differs from single-rank by design; its invariants: on each rank's block of
// slices exactly ceil(alpha * block) rows change, and they are that block's largest-L1 rows of the
// first step's gradient (the momentum at step 1 is grad_scale * G).
TEST(DistOptim, Dion3LocalScopeSelectsPerShard) {
  const int world = 2;
  Job job;
  job.kinds = {"dion3l"};
  job.steps = 1;
  auto got = run_ranks(world, job);
  ASSERT_EQ(got.count("dion3l"), 1u);
  Model m;
  m.set_grads(1, world, 0, false);
  std::vector<float> init = m.flat(), fin = got["dion3l"];
  int64_t off = 0, differs_from_global = 0;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    int64_t rows = kShapes[i][0], cols = kShapes[i][1];
    std::vector<int64_t> changed;
    for (int64_t r = 0; r < rows; ++r) {
      bool ch = false;
      for (int64_t c = 0; c < cols; ++c) ch = ch || fin[size_t(off + r * cols + c)] != init[size_t(off + r * cols + c)];
      if (ch) changed.push_back(r);
    }
    std::vector<float> l1(size_t(rows), 0.f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) l1[size_t(r)] += std::fabs(m.grads[i].f32()[r * cols + c]);
    size_t at = 0;
    for (int rk = 0; rk < world; ++rk) {
      RowBlock b = row_block(rows, rk, world);
      int64_t k = std::max<int64_t>(1, int64_t(std::ceil(0.25 * double(b.size()))));
      int64_t n_in = 0;
      float min_sel = INFINITY, max_unsel = -INFINITY;
      for (int64_t r = b.lo; r < b.hi; ++r) {
        bool sel = std::find(changed.begin(), changed.end(), r) != changed.end();
        n_in += sel;
        if (sel) min_sel = std::min(min_sel, l1[size_t(r)]);
        else max_unsel = std::max(max_unsel, l1[size_t(r)]);
      }
      EXPECT_EQ(n_in, k) << "matrix " << i << " rank " << rk;
      EXPECT_GE(min_sel, max_unsel) << "matrix " << i << " rank " << rk;
      at += size_t(n_in);
    }
    EXPECT_EQ(at, changed.size());
    // Global selection over the whole matrix would pick ceil(alpha * rows) rows in all.
    differs_from_global += int64_t(changed.size()) != std::max<int64_t>(1, int64_t(std::ceil(0.25 * double(rows))));
    off += rows * cols;
  }
  EXPECT_GT(differs_from_global, 0) << "the shapes should include one where local and global counts differ";
}

// World-size independent checkpoints: state saved by 2 ranks continues on 1 rank (the single-rank
// optimizer), and state saved by the single-rank optimizer continues on 3 ranks, both ending
// where an uninterrupted single-rank run ends.
TEST(DistOptim, CheckpointsMoveBetweenWorldSizes) {
  const std::vector<std::string> kinds = {"muon", "muon_red", "prmuon", "prmuon_fit", "dion3g"};
  std::string tag = fmt::format("/tmp/atoll_doptim_ck_{}", getpid());
  // world 2 -> world 1
  Job a;
  a.kinds = kinds;
  a.steps = 3;
  a.save = tag + ".a";
  ASSERT_EQ(run_ranks(2, a).size(), kinds.size());
  for (auto& kind : kinds) {
    Model m;
    auto opt = make_single(kind, m.refs);
    TensorFile f = load_safetensors(a.save + "." + kind);
    m.load(f);
    opt->load_state(f, "opt.");
    EXPECT_EQ(opt->steps(), 3);
    for (int t = 4; t <= 6; ++t) {
      m.set_grads(t, 1, 0, false);
      opt->step({0.9f, 0.5f});
    }
    std::remove((a.save + "." + kind).c_str());
    EXPECT_LE(max_rel(m.flat(), reference(kind, {2, 2, 2, 1, 1, 1})), 1e-6) << kind << ": world 2 -> 1";
  }
  // world 1 -> world 3
  Job b;
  b.kinds = kinds;
  b.start = 3;
  b.steps = 3;
  b.load = tag + ".b";
  for (auto& kind : kinds) reference(kind, {1, 1, 1}, 3, b.load);
  auto got = run_ranks(3, b);
  ASSERT_EQ(got.size(), kinds.size());
  for (auto& kind : kinds) {
    std::remove((b.load + "." + kind).c_str());
    EXPECT_LE(max_rel(got[kind], reference(kind, {1, 1, 1, 3, 3, 3})), 1e-6) << kind << ": world 1 -> 3";
  }
}

}  // namespace atl::parallel
