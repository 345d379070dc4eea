// Tensor parallelism through the trainer: `atoll launch --nproc-per-node 2 -- atoll train` with
// [parallel] tp = 2 follows the one-rank loss curve on the same batch (the two ranks of the tp
// group read the same rows), its checkpoint (the whole model) resumes on one rank, and a model
// whose heads do not split is refused before step 1 with the reason.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "launch_fixture.h"

using namespace atl;
using namespace atl::parallel::test;
namespace fs = std::filesystem;

namespace {

std::vector<double> losses(const fs::path& run) { return metric_values(run); }

// A 2-block GPT-2 tiny, 6 steps, evaluated and checkpointed every 3 steps.
struct TpFixture : LaunchFixture {
  TpFixture()
      : LaunchFixture("tp_launch",
                      "[model]\npreset = \"gpt2-tiny\"\nn_layer = 2\n"
                      "[train]\nsteps = 6\nbatch_size = 4\nseq_len = 32\nwarmup_steps = 2\nthreads = 1\n"
                      "[optim.adamw]\nlr = 1e-3\n[eval]\nevery = 3\nsteps = 2\n[sample]\nevery = 0\n[checkpoint]\n"
                      "every = 3\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n",
                      99) {}
};

// The printed losses are the job's fp32 loss; tensor parallelism moves them by ~1e-7 relative
// (test_tensor_parallel.cpp), far inside 1e-5.
void expect_close(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(b[i])) << what << " at step " << i + 1;
}

}  // namespace

TEST(LaunchTensorParallel, TwoRanksFollowOneRankAndResumeOnOne) {
  TpFixture f;
  ASSERT_EQ(f.train("one", 1, {}), 0);
  auto one = losses(f.root / "one");
  ASSERT_EQ(one.size(), 6u);
  EXPECT_LT(one.back(), one.front()) << "the loss must fall";
  // tp2 with sequence parallelism (the default), stopped after 3 steps with a checkpoint.
  ASSERT_EQ(f.train("tp", 2, {"--parallel.tp=2", "--train.stop_after=3"}), 0);
  std::string log = f.log("tp");
  EXPECT_NE(log.find("tensor parallel: tp = 2, sequence parallel on"), std::string::npos) << log;
  EXPECT_NE(log.find("mesh dp=1 tp=2"), std::string::npos) << log;
  expect_close(losses(f.root / "tp"), std::vector<double>(one.begin(), one.begin() + 3), "tp2 loss");
  // The checkpoint holds the whole model: one rank resumes it and ends on the one-rank curve.
  ASSERT_EQ(f.train("tp", 1, {"--resume"}), 0);
  expect_close(losses(f.root / "tp"), one, "tp2, then resumed on one rank");
  // Without sequence parallelism, all 6 steps.
  ASSERT_EQ(f.train("tp_nosp", 2, {"--parallel.tp=2", "--parallel.sequence_parallel=false"}), 0);
  expect_close(losses(f.root / "tp_nosp"), one, "tp2 without sequence parallelism");
}

TEST(LaunchTensorParallel, HeadsThatDoNotSplitAreRefusedBeforeStepOne) {
  TpFixture f;
  EXPECT_NE(f.train("bad", 2, {"--parallel.tp=2", "--model.n_head=1", "--model.n_kv_head=1"}, true), 0);
  std::string log = f.log("bad");
  EXPECT_NE(log.find("parallel.tp = 2: model.n_head = 1 is not divisible"), std::string::npos) << log;
  EXPECT_EQ(log.find("step     1"), std::string::npos) << "refused before training: " << log;
  EXPECT_FALSE(fs::exists(f.root / "bad" / "metrics.jsonl")) << log;
  // Sequence parallelism splits each micro-batch's tokens over the tp ranks: 31 tokens do not split.
  EXPECT_NE(f.train("odd", 2, {"--parallel.tp=2", "--train.batch_size=1", "--train.seq_len=31"}, true), 0);
  log = f.log("odd");
  EXPECT_NE(log.find("31 tokens does not split over parallel.tp = 2"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(f.root / "odd" / "metrics.jsonl")) << log;
}

// An optimizer that needs whole matrices or tables runs under tp in its tp form (each split
// matrix gathered and stepped whole: parallel/optim/tp_whole_matrix.h, bounded against one rank
// in test_tensor_parallel_optim.cpp) over ddp; under ZeRO it would get flat chunks of tp's blocks,
// so it is refused there before step 1, naming the key: a hidden-matrix type without ZeRO's tp
// form (Dion3; Muon and PRMuon have one since session 11, below) and a table optimizer's on the
// embedding (Ember's column statistics run over all the vocabulary's rows).
TEST(LaunchTensorParallel, OptimizersOfWholeMatricesOrTablesAreRefusedUnderZeroBeforeStepOne) {
  TpFixture f;
  for (auto [name, flag, key] : {std::tuple<const char*, const char*, const char*>{"dion3", "--optim.type=dion3",
                                                                                   "optim.type = 'dion3'"},
                                 {"ember", "--optim.embed=ember", "optim.embed = 'ember'"}}) {
    EXPECT_NE(f.train(name, 2, {"--parallel.tp=2", "--parallel.strategy=zero1", flag}, true), 0) << name;
    EXPECT_NE(f.log(name).find("parallel.tp = 2: " + std::string(key) + " works on whole matrices or tables"),
              std::string::npos) << f.log(name);
    EXPECT_NE(f.log(name).find("parallel.strategy = 'zero1' shards in flat chunks"), std::string::npos) << f.log(name);
    EXPECT_EQ(f.log(name).find("step     1/"), std::string::npos) << name << ": refused after training began";
  }
}

// Muon on the hidden matrices and Ember on the tied, vocabulary-split table at tp2: the job
// follows one rank's Muon + Ember curve, and its checkpoint (the whole optimizer state under the
// one-rank names: Muon's and Ember's kept whole on every tp rank, AdamW's blocks gathered) resumes
// on one rank and stays on that curve. The losses are within 1e-5 (test_tensor_parallel_optim.cpp
// bounds them at 1e-6 per step at the same parameters' trajectory).
TEST(LaunchTensorParallel, MuonAndEmberAtTp2FollowOneRankAndResumeOnOne) {
  TpFixture f;
  const std::vector<std::string> opt = {"--optim.type=muon", "--optim.embed=ember", "--optim.head=ember"};
  ASSERT_EQ(f.train("one", 1, opt), 0);
  auto one = losses(f.root / "one");
  ASSERT_EQ(one.size(), 6u);
  EXPECT_LT(one.back(), one.front()) << "the loss must fall";
  std::vector<std::string> a = opt;
  a.insert(a.end(), {"--parallel.tp=2", "--train.stop_after=3"});
  ASSERT_EQ(f.train("tp", 2, a), 0);
  const std::string log = f.log("tp");
  EXPECT_NE(log.find("gathered over tp and stepped whole"), std::string::npos) << log;
  expect_close(losses(f.root / "tp"), std::vector<double>(one.begin(), one.begin() + 3), "tp2 Muon + Ember loss");
  std::vector<std::string> r = opt;
  r.push_back("--resume");
  ASSERT_EQ(f.train("tp", 1, r), 0);
  expect_close(losses(f.root / "tp"), one, "tp2 Muon + Ember, then resumed on one rank");
}

TEST(LaunchTensorParallel, DataTimesTensorOnFourRanksFollowsOneRankAtDoubleBatch) {
  // dp2 x tp2: the two tp groups read different rows (split by the dp coordinate), so the job's
  // batch is 2 x 4 rows, one rank's at batch_size 8.
  TpFixture f;
  ASSERT_EQ(f.train("one8", 1, {"--train.batch_size=8", "--eval.every=0", "--checkpoint.every=0"}), 0);
  ASSERT_EQ(f.train("dp2tp2", 4, {"--parallel.tp=2", "--eval.every=0", "--checkpoint.every=0"}), 0);
  std::string log = f.log("dp2tp2");
  EXPECT_NE(log.find("mesh dp=2 tp=2"), std::string::npos) << log;
  EXPECT_NE(log.find("data parallel: ddp over 2 ranks"), std::string::npos) << "DDP over the dp axis: " << log;
  expect_close(losses(f.root / "dp2tp2"), losses(f.root / "one8"), "dp2 x tp2 loss");
}

TEST(LaunchTensorParallel, DataTimesTensorUnderZero2FollowsOneRankAndResumesOnOne) {
  // dp2 x tp2 with ZeRO-2 over the dp axis (dp_shard): the trainer sums tp's partial gradients
  // before the reduce-scatter and takes the norm over the chunks; its checkpoint (whole model,
  // whole optimizer state) resumes on one rank at the job's batch of 8 rows.
  TpFixture f;
  ASSERT_EQ(f.train("one8", 1, {"--train.batch_size=8"}), 0);
  ASSERT_EQ(f.train("z2", 4, {"--parallel.tp=2", "--parallel.strategy=zero2", "--train.stop_after=3"}), 0);
  std::string log = f.log("z2");
  EXPECT_NE(log.find("data parallel: zero2 over 2 ranks"), std::string::npos) << log;
  auto one = losses(f.root / "one8");
  ASSERT_EQ(one.size(), 6u);
  expect_close(losses(f.root / "z2"), std::vector<double>(one.begin(), one.begin() + 3), "dp2 x tp2 zero2 loss");
  ASSERT_EQ(f.train("z2", 1, {"--train.batch_size=8", "--resume"}), 0);
  expect_close(losses(f.root / "z2"), one, "dp2 x tp2 zero2, then resumed on one rank");
  // A strategy tp does not compose with is refused before step 1, naming the key.
  EXPECT_NE(f.train("scape", 2, {"--parallel.tp=2", "--parallel.strategy=scape"}, true), 0);
  EXPECT_NE(f.log("scape").find("parallel.tp = 2 composes with parallel.strategy = 'ddp', 'zero1', 'zero2', "
                                "'zero3' or 'hsdp'"), std::string::npos) << f.log("scape");
}

// dp2 x tp2 with ZeRO-3 over the dp axis (tensor_parallel_fsdp.cpp): each tp shard's units
// gathered over its dp pair for forward, backward and evaluation. Stopped after 3 steps, the
// checkpoint (ZeRO-3's units gathered over dp, then tp's shards: the whole model and optimizer
// state) resumes at dp2 x tp2 under ZeRO-3 and on one rank at the job's batch of 8 rows; the next
// step's loss of the two agrees to 1e-6 (not bit-exact: the tp sums and the dp average reassociate
// fp32 sums, bounded per step at 1e-6 in test_tensor_parallel.cpp).
TEST(LaunchTensorParallel, DataTimesTensorUnderZero3FollowsOneRankAndResumes) {
  TpFixture f;
  const std::vector<std::string> z3 = {"--parallel.tp=2", "--parallel.strategy=zero3"};
  ASSERT_EQ(f.train("one8", 1, {"--train.batch_size=8"}), 0);
  auto one = losses(f.root / "one8");
  ASSERT_EQ(one.size(), 6u);
  std::vector<std::string> first = z3;
  first.push_back("--train.stop_after=3");
  ASSERT_EQ(f.train("z3", 4, first), 0);
  std::string log = f.log("z3");
  EXPECT_NE(log.find("mesh dp=2 (shard) tp=2"), std::string::npos) << log;
  EXPECT_NE(log.find("data parallel: zero3 over 2 ranks"), std::string::npos) << log;
  expect_close(losses(f.root / "z3"), std::vector<double>(one.begin(), one.begin() + 3), "dp2 x tp2 zero3 loss");
  expect_close(metric_values(f.root / "z3", "val_loss"),
               std::vector<double>{metric_values(f.root / "one8", "val_loss").front()}, "dp2 x tp2 zero3 val loss");
  fs::copy(f.root / "z3", f.root / "z3_one", fs::copy_options::recursive);
  std::vector<std::string> again = z3;
  again.push_back("--resume");
  ASSERT_EQ(f.train("z3", 4, again), 0);
  ASSERT_EQ(f.train("z3_one", 1, {"--train.batch_size=8", "--resume"}), 0);
  EXPECT_NE(f.log("z3_one").find("resumed from"), std::string::npos) << f.log("z3_one");
  auto par = losses(f.root / "z3"), single = losses(f.root / "z3_one");
  expect_close(par, one, "dp2 x tp2 zero3, resumed at dp2 x tp2");
  expect_close(single, one, "dp2 x tp2 zero3, then resumed on one rank");
  ASSERT_EQ(par.size(), 6u);
  ASSERT_EQ(single.size(), 6u);
  const double next = std::abs(single[3] - par[3]) / std::abs(par[3]);
  EXPECT_LE(next, 1e-6) << "step 4 from the zero3 checkpoint: one rank " << single[3] << ", dp2 x tp2 " << par[3];
  std::printf("step 4 from the dp2 x tp2 zero3 checkpoint: one rank %.9g, dp2 x tp2 %.9g (relative %.2e, bound 1e-6)\n",
              single[3], par[3], next);
}

// Muon at dp2 x tp2 under ZeRO-3 through `atoll train` (session 11: the shard group's owner of
// each matrix assembles its tp block, the tp owners gather the update whole, sharded_muon.h):
// the job follows one rank's Muon curve at batch 8, and its step-3 checkpoint (momenta gathered
// over dp, then tp's blocks, under the one-rank names) resumes on one rank on the same curve.
// Bounds as expect_close's (test_tensor_parallel_optim.cpp bounds the same layout at 1e-6 a step).
TEST(LaunchTensorParallel, MuonUnderZero3TimesTensorFollowsOneRankAndResumesOnOne) {
  TpFixture f;
  const std::vector<std::string> muon = {"--optim.type=muon", "--train.batch_size=8"};
  ASSERT_EQ(f.train("one8", 1, muon), 0);
  auto one = losses(f.root / "one8");
  ASSERT_EQ(one.size(), 6u);
  EXPECT_LT(one.back(), one.front()) << "the loss must fall";
  std::vector<std::string> first = {"--optim.type=muon", "--parallel.tp=2", "--parallel.strategy=zero3",
                                    "--train.stop_after=3"};
  ASSERT_EQ(f.train("z3", 4, first), 0);
  const std::string log = f.log("z3");
  EXPECT_NE(log.find("mesh dp=2 (shard) tp=2"), std::string::npos) << log;
  expect_close(losses(f.root / "z3"), std::vector<double>(one.begin(), one.begin() + 3), "dp2 x tp2 zero3 Muon loss");
  ASSERT_EQ(f.train("z3", 1, {"--optim.type=muon", "--train.batch_size=8", "--resume"}), 0);
  EXPECT_NE(f.log("z3").find("resumed from"), std::string::npos) << f.log("z3");
  expect_close(losses(f.root / "z3"), one, "dp2 x tp2 zero3 Muon, then resumed on one rank");
}

// cp2 x tp2 on 4 ranks through `atoll train` (issue 11): both cp ranks of a tp coordinate read the
// same rows (their head and tail chunks), the tp pair the same ones, so the curve is one rank's at
// the same batch; recompute = selective re-runs the ring inside each tp shard's attention core.
// Stopped after 3 steps, the checkpoint (the whole model: ZeRO-1 gathered over dp x cp, then tp's
// shards) resumes both at cp2 x tp2 and at one rank; the next step's loss of the two agrees to
// the printed bound (not bit-exact: the ring's merge, the tp sums and the cp pair's gradient
// average reassociate fp32 sums; test_tensor_parallel.cpp bounds those at 1e-6 per step).
TEST(LaunchTensorParallel, ContextTimesTensorFollowsOneRankAndResumesOnOne) {
  TpFixture f;
  const std::vector<std::string> cptp = {"--parallel.cp=2", "--parallel.tp=2", "--parallel.strategy=zero1",
                                         "--train.recompute=selective"};
  ASSERT_EQ(f.train("one", 1, {}), 0);
  auto one = losses(f.root / "one");
  ASSERT_EQ(one.size(), 6u);
  std::vector<std::string> first = cptp;
  first.push_back("--train.stop_after=3");
  ASSERT_EQ(f.train("cptp", 4, first), 0);
  std::string log = f.log("cptp");
  EXPECT_NE(log.find("mesh dp=1 tp=2 pp=1 cp=2"), std::string::npos) << log;
  EXPECT_NE(log.find("tensor parallel: tp = 2, sequence parallel on"), std::string::npos) << log;
  EXPECT_NE(log.find("data parallel: zero1 over 2 ranks"), std::string::npos) << "ZeRO over dp x cp: " << log;
  expect_close(losses(f.root / "cptp"), std::vector<double>(one.begin(), one.begin() + 3), "cp2 x tp2 loss");
  fs::copy(f.root / "cptp", f.root / "cptp_one", fs::copy_options::recursive);
  std::vector<std::string> again = cptp;
  again.push_back("--resume");
  ASSERT_EQ(f.train("cptp", 4, again), 0);
  ASSERT_EQ(f.train("cptp_one", 1, {"--resume"}), 0);
  EXPECT_NE(f.log("cptp_one").find("resumed from"), std::string::npos) << f.log("cptp_one");
  auto par = losses(f.root / "cptp"), single = losses(f.root / "cptp_one");
  expect_close(par, one, "cp2 x tp2, resumed at cp2 x tp2");
  expect_close(single, one, "cp2 x tp2, then resumed on one rank");
  // Evaluation at step 3 (cp2 x tp2) and 6 (each resumed run) goes through the same sharded loss.
  expect_close(metric_values(f.root / "cptp", "val_loss"), metric_values(f.root / "one", "val_loss"),
               "cp2 x tp2 validation loss");
  expect_close(metric_values(f.root / "cptp_one", "val_loss"), metric_values(f.root / "one", "val_loss"),
               "cp2 x tp2, then one rank: validation loss");
  ASSERT_EQ(single.size(), 6u);
  ASSERT_EQ(par.size(), 6u);
  const double next = std::abs(single[3] - par[3]) / std::abs(par[3]);
  EXPECT_LE(next, 1e-6) << "step 4 from the cp2 x tp2 checkpoint: one rank " << single[3] << ", cp2 x tp2 " << par[3];
  std::printf("step 4 from the cp2 x tp2 checkpoint: one rank %.9g, cp2 x tp2 %.9g (relative %.2e, bound 1e-6)\n",
              single[3], par[3], next);
}

// Gradient accumulation under dp2 x tp2 ZeRO-3: the accumulation micro-steps run unsynchronised
// and the per-unit tp sum and the reduce-scatter happen on the last one. Against the same layout
// under ZeRO-1 (tp's sum after the all-reduce, the order tested above), on the same rows: the two
// differ only in where fp32 sums are taken, so the losses agree to 1e-5 like the others here.
TEST(LaunchTensorParallel, DataTimesTensorUnderZero3AccumulatesLikeZero1) {
  TpFixture f;
  const std::vector<std::string> common = {"--parallel.tp=2", "--train.grad_accum=2", "--train.batch_size=2",
                                           "--eval.every=0", "--checkpoint.every=0"};
  std::vector<std::string> z1 = common, z3 = common;
  z1.push_back("--parallel.strategy=zero1");
  z3.push_back("--parallel.strategy=zero3");
  ASSERT_EQ(f.train("acc_z1", 4, z1), 0);
  ASSERT_EQ(f.train("acc_z3", 4, z3), 0);
  EXPECT_NE(f.log("acc_z3").find("data parallel: zero3 over 2 ranks"), std::string::npos) << f.log("acc_z3");
  auto a = losses(f.root / "acc_z1");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_LT(a.back(), a.front()) << "the loss must fall";
  expect_close(losses(f.root / "acc_z3"), a, "dp2 x tp2 zero3 with grad_accum 2 vs zero1");
}
