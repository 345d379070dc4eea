// HSDP under model parallelism through the trainer (issue 11): `atoll launch --nproc-per-node 8 --
// atoll train` with tp2 x HSDP (dp_replicate 2 x dp_shard 2, FSDP inside each tp coordinate,
// parallel/tensor_parallel_fsdp.cpp) and with cp2 x HSDP (each replica's units sharded over its
// dp_shard x cp ranks, parallel/zero.h). Each layout follows one rank's loss curve at the job's
// batch (4 data-parallel coordinates x 4 rows: the tp and cp ranks of one coordinate read the same
// rows), stops after 3 steps with a checkpoint, and that checkpoint (the whole model and optimizer
// state) resumes both at the same layout and on one rank, whose next-step losses agree.
#include <gtest/gtest.h>

#include <filesystem>

#include "launch_fixture.h"

using namespace atl::parallel::test;
namespace fs = std::filesystem;

namespace {

// The tensor-parallel launch tests' model and schedule (test_tensor_parallel_launch.cpp).
struct HsdpFixture : LaunchFixture {
  HsdpFixture()
      : LaunchFixture("hsdp_mp_launch",
                      "[model]\npreset = \"gpt2-tiny\"\nn_layer = 2\n"
                      "[train]\nsteps = 6\nbatch_size = 4\nseq_len = 32\nwarmup_steps = 2\nthreads = 1\n"
                      "[optim.adamw]\nlr = 1e-3\n[eval]\nevery = 3\nsteps = 2\n[sample]\nevery = 0\n[checkpoint]\n"
                      "every = 3\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n",
                      99) {}
};

// The printed losses are the job's fp32 loss; the layouts move them by ~1e-7 relative
// (test_tensor_parallel.cpp bounds gradients at 1e-6 per step), far inside 1e-5.
void expect_close(const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_FALSE(a.empty()) << what;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(b[i])) << what << " at step " << i + 1;
}

// Trains `layout` on 8 ranks against one rank at batch 16, stopping after 3 steps and resuming at
// the layout and on one rank. mesh, dp: what the log must say.
void follows_and_resumes(const std::vector<std::string>& layout, const std::string& name, const std::string& mesh,
                         const std::string& dp = "data parallel: hsdp over ") {
  HsdpFixture f;
  ASSERT_EQ(f.train("one16", 1, {"--train.batch_size=16"}), 0);
  auto one = metric_values(f.root / "one16");
  ASSERT_EQ(one.size(), 6u);
  EXPECT_LT(one.back(), one.front()) << "the loss must fall";
  std::vector<std::string> first = layout;
  first.push_back("--train.stop_after=3");
  ASSERT_EQ(f.train(name, 8, first), 0);
  std::string log = f.log(name);
  EXPECT_NE(log.find(mesh), std::string::npos) << log;
  EXPECT_NE(log.find(dp), std::string::npos) << log;
  expect_close(metric_values(f.root / name), std::vector<double>(one.begin(), one.begin() + 3), name + " loss");
  fs::copy(f.root / name, f.root / (name + "_one"), fs::copy_options::recursive);
  std::vector<std::string> again = layout;
  again.push_back("--resume");
  ASSERT_EQ(f.train(name, 8, again), 0);
  ASSERT_EQ(f.train(name + "_one", 1, {"--train.batch_size=16", "--resume"}), 0);
  EXPECT_NE(f.log(name + "_one").find("resumed from"), std::string::npos) << f.log(name + "_one");
  auto par = metric_values(f.root / name), single = metric_values(f.root / (name + "_one"));
  expect_close(par, one, name + ", resumed at the same layout");
  expect_close(single, one, name + ", then resumed on one rank");
  ASSERT_EQ(par.size(), 6u);
  ASSERT_EQ(single.size(), 6u);
  // Not bit-exact: the layouts reassociate fp32 sums (tp's, the ring's merge, the two-stage
  // gradient reduction), bounded per step at 1e-6 in test_tensor_parallel.cpp.
  const double next = std::abs(single[3] - par[3]) / std::abs(par[3]);
  EXPECT_LE(next, 1e-6) << name << ": step 4 from the checkpoint: one rank " << single[3] << ", 8 ranks " << par[3];
  std::printf("%s: step 4 from the checkpoint: one rank %.9g, 8 ranks %.9g (relative %.2e, bound 1e-6)\n",
              name.c_str(), single[3], par[3], next);
}

}  // namespace

TEST(LaunchHsdp, TensorTimesHsdpOnEightRanksFollowsOneRankAndResumes) {
  follows_and_resumes({"--parallel.tp=2", "--parallel.strategy=hsdp", "--parallel.hsdp_shard_size=2"}, "tp2hsdp",
                      "mesh dp=4 (replicate 2 x shard 2) tp=2");
}

TEST(LaunchHsdp, ContextTimesHsdpOnEightRanksFollowsOneRankAndResumes) {
  follows_and_resumes({"--parallel.cp=2", "--parallel.strategy=hsdp", "--parallel.hsdp_shard_size=2"}, "cp2hsdp",
                      "mesh dp=4 (replicate 2 x shard 2) tp=1 pp=1 cp=2");
}

// The pipeline's sharded layouts under model parallelism (issue 11; refused before): pp2 x tp2 x
// ZeRO-3 (each tp rank's stage shard sharded over its dp pair) and pp2 x cp2 x HSDP (two replicas,
// each stage's parameters sharded over its cp pair), 2 data-parallel coordinates x 8 rows. Their
// checkpoints gather every parameter from the rank that keeps it (under tp its shards over the
// stage's tp pair) and resume at the layout and on one rank.
TEST(LaunchHsdp, PipelineTimesTensorUnderZero3OnEightRanksFollowsOneRankAndResumes) {
  follows_and_resumes({"--parallel.pp=2", "--parallel.tp=2", "--parallel.strategy=zero3", "--train.batch_size=8"},
                      "pp2tp2z3", "tp=2 pp=2", "pipeline 1f1b (pp = 2, tp = 2) x zero3 over dp = 2");
}

TEST(LaunchHsdp, PipelineTimesContextTimesHsdpOnEightRanksFollowsOneRankAndResumes) {
  follows_and_resumes({"--parallel.pp=2", "--parallel.cp=2", "--parallel.strategy=hsdp", "--parallel.hsdp_shard_size=1",
                       "--train.batch_size=8"},
                      "pp2cp2hsdp", "pp=2 cp=2", "pipeline 1f1b (pp = 2) x hsdp over dp x cp = 2, 2 replicas");
}
