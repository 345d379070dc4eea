// The error feedback of DDP's and ZeRO's gradient codecs in checkpoints (lowcomm/codec_checkpoint.h)
// through `atoll launch -- atoll train`: a run with a lossy codec and error feedback, stopped and
// resumed, is bit-exact with the uninterrupted run (without the residuals and the rounding call
// counters it is not: the first resumed step would add no residual); resuming on another number
// of ranks remaps DDP's residuals and refuses ZeRO-2's where its buckets change size, naming the keys.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "launch_fixture.h"
#include "lowcomm/codec_checkpoint.h"
#include "tensor/safetensors.h"

using namespace atl;
using namespace atl::parallel::test;
namespace fs = std::filesystem;

namespace {

// A 2-block GPT-2 tiny, 6 steps, checkpointed at the end (and at a stop).
struct CodecResume : LaunchFixture {
  CodecResume()
      : LaunchFixture("codec_resume",
                      "[model]\npreset = \"gpt2-tiny\"\nn_layer = 2\n"
                      "[train]\nsteps = 6\nbatch_size = 4\nseq_len = 32\nwarmup_steps = 2\nthreads = 1\n"
                      "[optim.adamw]\nlr = 1e-2\n[eval]\nevery = 0\n[sample]\nevery = 0\n[checkpoint]\nevery = 0\n"
                      "keep = 100\n[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n",
                      4243) {}
  int train(const std::string& run, int ranks, std::vector<std::string> extra, bool expect_fail = false) {
    return LaunchFixture::train(run, ranks, std::move(extra), expect_fail, /*always_launch=*/true);
  }
};

std::vector<float> model_of(const fs::path& ck) {
  std::vector<float> v;
  for (auto& [n, t] : load_safetensors((ck / "model.safetensors").string()).tensors)
    if (t.dtype() == DType::f32) {
      auto x = t.contiguous().to_vector();
      v.insert(v.end(), x.begin(), x.end());
    }
  return v;
}

// The sum of |x| over the checkpoint's parallel.codec.rank<r>.*.residual entries.
double residual_mass(const fs::path& ck, int r) {
  double s = 0;
  const std::string p = "parallel.codec.rank" + std::to_string(r) + ".";
  for (auto& [n, t] : load_safetensors((ck / "optimizer.safetensors").string()).tensors)
    if (n.rfind(p, 0) == 0 && n.find(".residual") != std::string::npos)
      for (float x : t.contiguous().to_vector()) s += std::abs(x);
  return s;
}

}  // namespace

TEST(CodecResume, StoppedAndResumedWithErrorFeedbackIsBitExact) {
  CodecResume f;
  // DDP with nvfp4 (stochastic rounding: the call counters matter too), ZeRO-2 with int8, and
  // DDP with int8 inside 2 islands of 2 ranks (DiLoCo, its own int8 exchange across).
  for (auto cfg : std::vector<std::vector<std::string>>{
           {"--parallel.strategy=ddp", "--parallel.codec=nvfp4"},
           {"--parallel.strategy=zero2", "--parallel.codec=int8"},
           {"--parallel.strategy=ddp", "--parallel.codec=int8", "--parallel.islands=2", "--lowcomm.inner_steps=2",
            "--lowcomm.exchange=int8"}}) {
    const int ranks = cfg.size() > 2 ? 4 : 2;
    const std::string tag = cfg[0].substr(cfg[0].find('=') + 1) + (ranks == 4 ? "_islands" : "");
    auto args = with(cfg, {"--parallel.error_feedback=true"});
    ASSERT_EQ(f.train(tag + "_full", ranks, args), 0);
    ASSERT_EQ(f.train(tag + "_cut", ranks, with(args, {"--train.stop_after=3"})), 0);
    // The last rank's residuals are in the checkpoint, and are not all zero.
    EXPECT_GT(residual_mass(f.ckpt(tag + "_cut", 3), ranks - 1), 0.0) << tag << ": the last rank's error feedback is not saved";
    ASSERT_EQ(f.train(tag + "_cut", ranks, with(args, {"--resume"})), 0);
    EXPECT_NE(f.log(tag + "_cut").find("resumed from"), std::string::npos) << f.log(tag + "_cut");
    const auto a = model_of(f.ckpt(tag + "_full", 6)), b = model_of(f.ckpt(tag + "_cut", 6));
    ASSERT_FALSE(a.empty());
    EXPECT_EQ(rel_diff(b, a), 0.0) << tag << ": the resumed run's parameters differ";
    const auto la = metric_values(f.root / (tag + "_full")), lb = metric_values(f.root / (tag + "_cut"));
    ASSERT_EQ(la.size(), 6u);
    ASSERT_EQ(lb.size(), 6u);
    for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i], lb[i]) << tag << " step " << i + 1;
  }
}

TEST(CodecResume, AnotherNumberOfRanksRemapsDdpAndRefusesZeroBucketsThatChangeSize) {
  CodecResume f;
  // DDP's buckets do not depend on the ranks: 2 ranks' residuals go on over 3, with a warning.
  const std::vector<std::string> ddp = {"--parallel.strategy=ddp", "--parallel.codec=int8", "--parallel.error_feedback=true"};
  ASSERT_EQ(f.train("ddp", 2, with(ddp, {"--train.stop_after=3"})), 0);
  ASSERT_EQ(f.train("ddp", 3, with(ddp, {"--resume"})), 0);
  std::string log = f.log("ddp");
  EXPECT_NE(log.find("error feedback of 2 ranks remapped to 3"), std::string::npos) << log;
  EXPECT_GT(residual_mass(f.ckpt("ddp", 6), 2), 0.0) << "rank 2 of the resumed run saved no error feedback";
  // ZeRO-2 rounds its bucket (one here: the whole model) up to a multiple of the ranks: from 2
  // ranks to 3 it changes size unless the model's size is a multiple of 6.
  const std::vector<std::string> z2 = {"--parallel.strategy=zero2", "--parallel.codec=int8", "--parallel.error_feedback=true"};
  ASSERT_EQ(f.train("z2", 2, with(z2, {"--train.stop_after=3"})), 0);
  int64_t numel = 0;
  for (auto& [n, t] : load_safetensors((f.ckpt("z2", 3) / "model.safetensors").string()).tensors) numel += t.numel();
  const TensorFile opt = load_safetensors((f.ckpt("z2", 3) / "optimizer.safetensors").string());
  const Tensor* meta = opt.find("parallel.codec.rank0.bucket0.meta");
  ASSERT_NE(meta, nullptr) << "no bucket0 state in the ZeRO-2 checkpoint";
  ASSERT_EQ(meta->contiguous().data<int64_t>()[0], (numel + 1) / 2 * 2) << "the test expects a single bucket";
  const bool changes = (numel + 2) / 3 * 3 != (numel + 1) / 2 * 2;
  ASSERT_TRUE(changes) << "the model has a multiple of 6 parameters; pick another size for this test";
  EXPECT_NE(f.train("z2", 3, with(z2, {"--resume"}), true), 0);
  log = f.log("z2");
  EXPECT_NE(log.find("parallel.codec.rank0.bucket0.meta"), std::string::npos) << log;
  EXPECT_NE(log.find("saved by 2 data-parallel ranks and does not fit this job's 3"), std::string::npos) << log;
}

// The remap of one data-parallel group (lowcomm/codec_checkpoint.h): old world ranks 2 and 3
// (island 1 of 2 islands of 2 ranks) to the 3 ranks of island 1 in the new job. The residuals
// (unsent gradient) are summed onto the group's new rank 0 and only theirs (ranks 0 and 1 of the
// old job belong to island 0's reduction), the owners' re-encode residuals (rank j's covers
// elements [j c, (j + 1) c) of the reduced bucket) are cut into the new owners' chunks, and the
// meta (size, call counter) is the group's first rank's.
TEST(CodecResume, RemapTakesOnlyItsOwnGroupsResiduals) {
  const int64_t n = 5;
  lowcomm::NamedTensors ours;
  for (int r = 0; r < 4; ++r) {
    const std::string p = "parallel.codec.rank" + std::to_string(r) + ".bucket0.";
    Tensor meta = Tensor::empty({2}, DType::i64);
    meta.data<int64_t>()[0] = n;
    meta.data<int64_t>()[1] = 7 + r;
    ours.emplace_back(p + "meta", meta);
    std::vector<float> res, res2;
    for (int64_t i = 0; i < n; ++i) res.push_back(float(100 * r + i));
    for (int64_t i = 0; i < 3; ++i) res2.push_back(float(1000 * r + i));  // chunk of 3 (5 over 2 owners)
    ours.emplace_back(p + "residual", Tensor::from_vector(res, {n}));
    ours.emplace_back(p + "residual2", Tensor::from_vector(res2, {3}));
  }
  const std::vector<std::pair<std::string, int64_t>> tensors = {{"bucket0", n}};
  std::vector<std::vector<float>> res(3), res2(3);
  for (int me = 0; me < 3; ++me) {
    lowcomm::NamedTensors got = lowcomm::remap_codec_state(ours, {2, 3}, tensors, me, 3, "test");
    ASSERT_EQ(got.size(), 3u) << me;
    for (auto& [k, t] : got) {
      if (k == "bucket0.meta") EXPECT_EQ(t.contiguous().data<int64_t>()[1], 9) << "old rank 2's call counter";
      if (k == "bucket0.residual") res[size_t(me)] = t.contiguous().to_vector();
      if (k == "bucket0.residual2") res2[size_t(me)] = t.contiguous().to_vector();
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(res[0][size_t(i)], float(200 + i) + float(300 + i)) << "ranks 2 and 3 summed, element " << i;
    EXPECT_EQ(res[1][size_t(i)], 0.f);
    EXPECT_EQ(res[2][size_t(i)], 0.f);
  }
  // Old owners' chunks (2000, 2001, 2002 | 3000, 3001) of the 5 elements; new chunks of 2.
  const std::vector<float> whole = {2000, 2001, 2002, 3000, 3001};
  for (int me = 0; me < 3; ++me) {
    ASSERT_EQ(res2[size_t(me)].size(), 2u);
    for (int i = 0; i < 2; ++i) {
      const size_t at = size_t(2 * me + i);
      EXPECT_EQ(res2[size_t(me)][size_t(i)], at < whole.size() ? whole[at] : 0.f) << me << " " << i;
    }
  }
}

// Islands (DiLoCo, 2 islands) with DDP's int8 codec inside, stopped on 2 ranks per island and
// resumed on 3: each island's residuals go to the same island's ranks (the remap above, groups
// found from the ranks' data-parallel communicators), the run finishes, and the new last island's
// first rank (world rank 3) carries error feedback; before session 9 this was refused.
TEST(CodecResume, IslandsResumedWithMoreRanksPerIslandRemapEachIslandsResiduals) {
  CodecResume f;
  const std::vector<std::string> isl = {"--parallel.strategy=ddp", "--parallel.codec=int8", "--parallel.error_feedback=true",
                                        "--parallel.islands=2", "--lowcomm.inner_steps=2"};
  ASSERT_EQ(f.train("isl", 4, with(isl, {"--train.stop_after=3"})), 0);
  ASSERT_EQ(f.train("isl", 6, with(isl, {"--resume"})), 0);
  const std::string log = f.log("isl");
  EXPECT_NE(log.find("error feedback of 4 ranks remapped to 6 (2 data-parallel groups of 2 ranks to 3"),
            std::string::npos) << log;
  const auto l = metric_values(f.root / "isl");
  ASSERT_EQ(l.size(), 6u);
  EXPECT_GT(residual_mass(f.ckpt("isl", 6), 3), 0.0) << "island 1's first rank saved no error feedback";
  // Another number of islands (3 of 2 ranks: the groups do not correspond) is refused, naming the
  // layouts, before lowcomm's own check of the island count.
  EXPECT_NE(f.train("isl", 6, with({"--parallel.strategy=ddp", "--parallel.codec=int8", "--parallel.error_feedback=true",
                                     "--parallel.islands=3", "--lowcomm.inner_steps=2", "--train.steps=8"}, {"--resume"}),
                    true), 0);
  EXPECT_NE(f.log("isl").find("remapped only between jobs with the same groups"), std::string::npos) << f.log("isl");
  // tp 2 without islands: each tp coordinate's dp ranks reduce their shard's buckets with a codec
  // of their own; 2 dp ranks to 3, each tp coordinate's residuals to the same coordinate's ranks.
  const std::vector<std::string> tp = {"--parallel.strategy=ddp", "--parallel.codec=int8", "--parallel.error_feedback=true",
                                       "--parallel.tp=2"};
  ASSERT_EQ(f.train("tp", 4, with(tp, {"--train.stop_after=3"})), 0);
  ASSERT_EQ(f.train("tp", 6, with(tp, {"--resume"})), 0);
  EXPECT_NE(f.log("tp").find("error feedback of 4 ranks remapped to 6 (2 data-parallel groups of 2 ranks to 3"),
            std::string::npos) << f.log("tp");
  ASSERT_EQ(metric_values(f.root / "tp").size(), 6u);
}
