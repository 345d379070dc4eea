// Pipeline parallelism for the MoE family (models/moe: PipelineStages), alone and with expert
// parallelism (pp x ep: parallel/expert_shards.h's set_pipeline), through `atoll train`'s trainer
// on rank processes of this binary (ExpertParallel.RankProgram, test_expert_parallel.cpp):
//  - pp 2 on 2 ranks, with the routers' auxiliary losses on, under 1F1B, interleaved (2 virtual
//    stages) and ZB-H1, follows one rank over the same global batches: the auxiliary losses of a
//    stage's MoE layers are a second root of its backward (seeded as one process's loss seeds
//    them), and their values reach the reported loss; the checkpoint has one process's names;
//  - pp 2 x dp_shard 2 x ep 2 on 4 ranks follows one rank at the doubled batch, evaluates (every
//    stage's experts bound for it), writes one process's checkpoint, and resumes both ways: that
//    checkpoint in one process, and one process's in a pp x ep job whose first stage holds no MoE
//    layer (pp_layers = [1, 2]: a stage without experts).
//
// Tolerances. pp alone: every stage runs one process's kernels on one process's micro-batches
// in the same order (test_pipeline.cpp's argument); what differs is the gradient norm (summed per
// stage), the tied embedding's gradient (summed per stage then added) and the reported loss
// (auxiliary terms summed per stage), each a few fp32 roundings (~6e-8 relative), which AdamW
// (eps 1e-5) does not amplify over 4 steps: 1e-6 relative on the losses (measured 5.7e-8; the
// validation losses were bit-identical). Without the auxiliary gradient (the seed removed) the
// routers train differently and the losses part by 1.5e-3 within 4 steps at aux_loss_coef = 0.1,
// over 1000x the bound. pp x ep at the doubled batch: the same few re-associated sums plus the
// mean over two half batches vs one batch and the expert gradients summed over their replicas
// (test_expert_parallel.cpp's argument, ~1 ulp each; its 10-step jobs reach ~4e-8): 1e-6
// (measured 5.7e-8 over 4 steps and both resumes), with the balance loss off (it is not a mean
// over tokens, test_expert_parallel.cpp says why).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/config.h"
#include "harness.h"
#include "launch_fixture.h"
#include "tensor/safetensors.h"
#include "train/metrics.h"
#include "train/trainer.h"

using namespace atl;
using namespace atl::parallel::test;
namespace fs = std::filesystem;

namespace {

struct Scratch {
  fs::path root = fs::temp_directory_path() / ("atoll_moe_pp_" + std::to_string(getpid()));
  Scratch() { fs::create_directories(root); }
  ~Scratch() { fs::remove_all(root); }
};

struct Runs {
  Scratch s;
  Runs() {
    prepare_word_corpus(s.root, {"stages", "route", "tokens", "to", "experts", "and", "back", "down", "the", "pipe"},
                        4242);
  }
  fs::path config(const std::string& run, int batch, const std::string& model, const std::string& parallel,
                  int steps = 4) const {
    std::ostringstream c;
    c << "[run]\ndir = \"" << (s.root / run).string() << "\"\n[data]\ndir = \"" << (s.root / "data").string()
      << "\"\nauto_prepare = false\n[model]\nfamily = \"moe\"\npreset = \"moe-tiny\"\nn_experts = 4\n" << model
      << "[train]\nsteps = " << steps << "\nbatch_size = " << batch << "\ngrad_accum = 4\nseq_len = 16\n"
      << "warmup_steps = 1\nthreads = 1\n[optim.adamw]\nlr = 3e-3\neps = 1e-5\n[eval]\nevery = 2\nsteps = 2\n"
      << "[sample]\nevery = 0\n[checkpoint]\nevery = 4\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n"
      << (parallel.empty() ? "" : "[parallel]\n" + parallel);
    fs::path p = s.root / (run + ".toml");
    std::ofstream(p) << c.str();
    return p;
  }
  void one(const std::string& run, int batch, const std::string& model, int steps = 4, bool resume = false) const {
    Config c = Config::load(config(run, batch, model, "", steps).string());
    Trainer(c).run(resume);
  }
  // Runs `world` rank processes of the trainer; returns rank 0's log.
  std::string ranks(int world, const std::string& run, int batch, const std::string& model,
                    const std::string& parallel, int steps = 4, bool resume = false) const {
    fs::path cfg = config(run, batch, model, parallel, steps);
    std::vector<std::string> env{"ATOLL_EP_TRAIN_CFG=" + cfg.string()};
    if (resume) env.push_back("ATOLL_EP_TRAIN_RESUME=1");
    const std::string tag = (s.root / run).string() + "_log";
    auto codes = run_rank_programs(world, "ExpertParallel.RankProgram", env, tag, 180);
    for (size_t r = 0; r < codes.size(); ++r)
      EXPECT_EQ(codes[r], 0) << run << " rank " << r << ":\n" << read_file(tag + ".log" + std::to_string(r));
    return read_file(tag + ".log0");
  }
  std::vector<double> metric(const std::string& run, const char* key) const {
    std::vector<double> v;
    for (auto& rec : read_metrics((s.root / run / "metrics.jsonl").string()))
      if (rec.contains(key)) v.push_back(double(rec[key]));
    return v;
  }
  std::map<std::string, Shape> names_shapes(const std::string& run, const char* file) const {
    std::map<std::string, Shape> m;
    for (auto& [n, t] : load_safetensors((s.root / run / "checkpoints/step_00000004" / file).string()).tensors)
      m[n] = t.shape();
    return m;
  }
  void seed_checkpoint(const std::string& from, const std::string& run) const {
    fs::create_directories(s.root / run / "checkpoints");
    fs::copy(s.root / from / "checkpoints/step_00000004", s.root / run / "checkpoints/step_00000004",
             fs::copy_options::recursive);
  }
};

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(want.empty()) << what;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(got[i] - want[i]) / std::max(1e-12, std::fabs(want[i]));
    worst = std::max(worst, d);
    EXPECT_LT(d, rel) << what << " entry " << i << ": " << got[i] << " vs " << want[i];
  }
  std::printf("%s: worst relative difference %.3g (bound %.3g)\n", what.c_str(), worst, rel);
}

}  // namespace

TEST(MoEPipeline, TwoStagesFollowOneRankWithTheAuxiliaryLossesUnderEverySchedule) {
  Runs r;
  const std::string model = "n_layer = 4\naux_loss_coef = 0.1\n";  // 4 blocks: 2 virtual stages of 1 per rank
  r.one("one", 4, model);
  const auto loss = r.metric("one", "loss"), val = r.metric("one", "val_loss");
  ASSERT_EQ(loss.size(), 4u);
  ASSERT_EQ(val.size(), 2u);
  EXPECT_LT(loss.back(), loss.front()) << "the reference did not train";
  for (const auto& [run, keys] : std::map<std::string, std::string>{
           {"f1b", "pp = 2\npp_schedule = \"1f1b\"\n"},
           {"interleaved", "pp = 2\npp_schedule = \"interleaved\"\npp_virtual = 2\n"},
           {"zb", "pp = 2\npp_schedule = \"zb-h1\"\n"}}) {
    const std::string log = r.ranks(2, run, 4, model, keys);
    EXPECT_NE(log.find("pp=2"), std::string::npos) << log;
    expect_close(r.metric(run, "loss"), loss, 1e-6, run + " losses");
    expect_close(r.metric(run, "val_loss"), val, 1e-6, run + " validation losses");
    for (const char* f : {"model.safetensors", "optimizer.safetensors"})
      EXPECT_EQ(r.names_shapes(run, f), r.names_shapes("one", f)) << run << " " << f;
  }
}

TEST(MoEPipeline, TwoStagesTimesEp2FollowOneRankAndResumeAcrossLayouts) {
  Runs r;
  const std::string model = "aux_loss_coef = 0.0\n";
  const std::string pp_ep = "strategy = \"zero1\"\npp = 2\ndp_shard = 2\nep = 2\n";
  r.one("one", 8, model);
  const std::string log = r.ranks(4, "ppep", 4, model, pp_ep);
  EXPECT_NE(log.find("ep=2"), std::string::npos) << log;
  EXPECT_NE(log.find("pp=2"), std::string::npos) << log;
  expect_close(r.metric("ppep", "loss"), r.metric("one", "loss"), 1e-6, "pp x ep losses");
  expect_close(r.metric("ppep", "val_loss"), r.metric("one", "val_loss"), 1e-6, "pp x ep validation losses");
  // One process's names and shapes: every stage's experts, gathered over each stage's ep group.
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(r.names_shapes("ppep", f), r.names_shapes("one", f)) << f;
  EXPECT_EQ(r.names_shapes("ppep", "model.safetensors")["model.layers.2.mlp.experts.down_proj"], (Shape{4, 16, 32}));

  // Steps 5-6: one process continued, one process from the pp x ep checkpoint, and a pp x ep job
  // (its first stage without an MoE layer) from one process's checkpoint.
  r.seed_checkpoint("one", "one6");
  r.seed_checkpoint("ppep", "one_from_ppep");
  r.seed_checkpoint("one", "ppep_from_one");
  r.one("one6", 8, model, 6, true);
  r.one("one_from_ppep", 8, model, 6, true);
  const std::string resumed = r.ranks(4, "ppep_from_one", 4, model, pp_ep + "pp_layers = [1, 2]\n", 6, true);
  EXPECT_NE(resumed.find("resumed from"), std::string::npos) << resumed;
  const auto cont = r.metric("one6", "loss");
  ASSERT_EQ(cont.size(), 2u);
  expect_close(r.metric("one_from_ppep", "loss"), cont, 1e-6, "one process from the pp x ep checkpoint");
  expect_close(r.metric("ppep_from_one", "loss"), cont, 1e-6, "pp x ep (pp_layers [1, 2]) from one process's");
}

// pp x ep with the other axes a stage's MoE layers compose with: context parallelism (pp 2 x cp 2
// x ep 2 on 4 ranks: the ep group is the stage's cp pair, each routing its spans of every row;
// the routers' balance statistics sum over cp, so the auxiliary losses stay on) and tensor
// parallelism (pp 2 x dp_shard 2 x tp 2 x ep 2 on 8 ranks: each tp rank dispatches its
// sequence-parallel share). Each against one rank on the same global batch, the bound above.
TEST(MoEPipeline, TwoStagesTimesEp2UnderContextOrTensorParallelismFollowOneRank) {
  Runs r;
  r.one("one_cp", 4, "aux_loss_coef = 0.1\n");
  const std::string cp_log = r.ranks(4, "ppcpep", 4, "aux_loss_coef = 0.1\n", "pp = 2\ncp = 2\nep = 2\n");
  EXPECT_NE(cp_log.find("cp=2"), std::string::npos) << cp_log;
  expect_close(r.metric("ppcpep", "loss"), r.metric("one_cp", "loss"), 1e-6, "pp x cp x ep losses");
  expect_close(r.metric("ppcpep", "val_loss"), r.metric("one_cp", "val_loss"), 1e-6, "pp x cp x ep validation losses");
  r.one("one_tp", 8, "aux_loss_coef = 0.0\n");
  const std::string tp_log =
      r.ranks(8, "pptpep", 4, "aux_loss_coef = 0.0\n", "strategy = \"zero1\"\npp = 2\ndp_shard = 2\ntp = 2\nep = 2\n");
  EXPECT_NE(tp_log.find("tp=2"), std::string::npos) << tp_log;
  expect_close(r.metric("pptpep", "loss"), r.metric("one_tp", "loss"), 1e-6, "pp x tp x ep losses");
  expect_close(r.metric("pptpep", "val_loss"), r.metric("one_tp", "val_loss"), 1e-6, "pp x tp x ep validation losses");
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(r.names_shapes("pptpep", f), r.names_shapes("one_tp", f)) << f;
}
