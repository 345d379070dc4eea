// Pipeline parallelism inside the islands (lowcomm/pipeline_islands.cpp), through `atoll launch --
// atoll train`: DiLoCo over 2 islands each running a 2-stage pipeline (4 ranks) follows DiLoCo
// over 2 islands of one rank on the same global batch, and IsoLoCo likewise; the islands agree
// bitwise after each outer step; the outer state is per stage in the checkpoint; the tied embedding's two copies
// stay equal; a stopped and resumed run is bit-exact; tp or cp inside the stages follows too; what does
// not compose is refused before step 1, naming the keys.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "islands_fixture.h"

using namespace atl;
using namespace atl::parallel::test;
namespace fs = std::filesystem;

namespace {

// gpt2-tiny ties its head to the token embedding, so the last stage holds a copy of it. Two
// micro-batches per step on both sides (the pipeline's m; one process accumulates the same two).
struct IslandsPp : IslandsFixture {
  IslandsPp() : IslandsFixture("islands_pp", "grad_accum = 2\n") {}
};

}  // namespace

// Bound. The pipeline computes each micro-batch's forward and backward as one process does, but
// sums the tied embedding's gradient in another order: one process accumulates the head's and
// the embedding's contributions micro-batch by micro-batch, the pipeline sums each stage's over
// the micro-batches and then the two stages' (a few ulps on that matrix), and the clipping norm
// is summed per stage in double. AdamW's normalised update turns gradients that are rounding noise
// (the attention's key bias: softmax ignores it) into lr-sized steps, and two outer Nesterov steps
// (lr 0.7, momentum 0.9) carry them on — the same mechanism as the tp and cp islands tests, whose
// bound this takes: 1e-4 relative for the whole model (measured: printed), 1e-5 for the losses.
// The faults it catches are far above it: each stage averaged with the wrong share group, the
// other stage's pseudo-gradient, or no exchange at all change every outer step's mean (measured
// by hand in docs/islands.md, Session 11).
TEST(IslandsPipeline, DiLoCoWithPp2InsideTwoIslandsFollowsDiLoCoWithoutPp) {
  IslandsPp f;
  ASSERT_EQ(f.train("plain", 2, {}), 0);
  ASSERT_EQ(f.train("pp", 4, {"--parallel.pp=2", "--checkpoint.every=1"}), 0);
  const std::string log = f.log("pp");
  EXPECT_NE(log.find("islands: diloco over 2 islands"), std::string::npos) << log;
  EXPECT_NE(log.find("pp=2"), std::string::npos) << log;
  EXPECT_EQ(log.find("tied copy"), std::string::npos) << "the tied embedding's copies parted:\n" << log;
  const auto a = metric_values(f.root / "plain"), b = metric_values(f.root / "pp");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  EXPECT_LT(a.back(), a.front()) << "the loss must fall";
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << "step " << i + 1;
  const auto pa = model_of(f.ckpt("plain", 6)), pb = model_of(f.ckpt("pp", 6));
  ASSERT_EQ(pa.size(), pb.size()) << "the pipeline's checkpoint holds the whole model";
  const double d = rel_diff(pb, pa);
  std::printf("DiLoCo over 2 islands of pp2 vs of one rank: parameters %.2e relative apart\n", d);
  EXPECT_LT(d, 1e-4);
  // The islands (their stages gathered whole) agree bitwise after each outer step, not inside a round.
  for (int step : {3, 6}) EXPECT_EQ(rel_diff(island1_of(f.ckpt("pp", step)), model_of(f.ckpt("pp", step))), 0.0) << step;
  EXPECT_GT(rel_diff(island1_of(f.ckpt("pp", 4)), model_of(f.ckpt("pp", 4))), 0.0) << "islands equal mid-round";
  // The outer state is per stage: stage 0 the embeddings and block 0, stage 1 block 1, the final
  // norm and its copy of the lower root.
  const TensorFile opt = optim_of(f.ckpt("pp", 6));
  const Tensor *g0 = opt.find("lowcomm.pp.rank0.global"), *g1 = opt.find("lowcomm.pp.rank1.global");
  ASSERT_NE(g0, nullptr);
  ASSERT_NE(g1, nullptr);
  EXPECT_NE(opt.find("lowcomm.pp.rank1.momentum"), nullptr);
  EXPECT_EQ(opt.find("lowcomm.global"), nullptr) << "no whole-model outer state under pp";
  const TensorFile mf = load_safetensors((f.ckpt("pp", 6) / "model.safetensors").string());
  // The last stage's copy is of the whole lower root the tied head reads: wte and wpe, each
  // padded in the flat buffers to a 16-element boundary.
  int64_t lower = 0, lower_padded = 0;
  for (auto& [n, t] : mf.tensors)
    if (n.find("wte") != std::string::npos || n.find("wpe") != std::string::npos)
      lower += t.numel(), lower_padded += (t.numel() + 15) / 16 * 16;
  ASSERT_GT(lower, 0);
  // (padding: the flat buffers start each parameter on a 16-element boundary)
  EXPECT_GE(g0->numel() + g1->numel(), int64_t(pb.size()) + lower) << "the model, the tied copy twice";
  EXPECT_LT(g0->numel() + g1->numel(), int64_t(pb.size()) + lower + 16 * 64) << "the model, the tied copy twice";
  // Each stage sends its own parameters across: rank 0 (stage 0) less than a whole model, the
  // job's total more than without pp by the tied copy (sent by both stages).
  const auto wa = wan_bytes_of(f.root / "plain"), wb = wan_bytes_of(f.root / "pp");
  const auto ja = wan_bytes_of(f.root / "plain", "wan_bytes_job"), jb = wan_bytes_of(f.root / "pp", "wan_bytes_job");
  ASSERT_EQ(wa.size(), 2u);
  ASSERT_EQ(wb.size(), 2u);
  std::printf("bytes across per outer step: rank 0 one rank %lld, pp2 stage 0 %lld; job %lld vs %lld\n",
              (long long)wa[0], (long long)wb[0], (long long)ja[0], (long long)jb[0]);
  EXPECT_LT(wb[0], wa[0]);
  // Per island and outer step each stage's rank sends its stage's 4-byte values once (a 2-rank
  // ring sends half its buffer twice): 2 islands x 4 bytes x the copied lower root more.
  EXPECT_EQ(jb[0], ja[0] + 8 * lower_padded) << "the tied copy crosses once more per island";
}

// Run "pp" (islands of pp 2) against run "plain" (islands of one rank) with the DiLoCo test's
// bounds: the 6 losses within 1e-5 relative and falling, no "tied copy" warning, the final
// parameters within 1e-4; returns how far apart those are (printed under `what`).
static double pp_run_follows(const IslandsPp& f, const std::string& what) {
  EXPECT_EQ(f.log("pp").find("tied copy"), std::string::npos) << "the tied embedding's copies parted:\n" << f.log("pp");
  const auto a = metric_values(f.root / "plain"), b = metric_values(f.root / "pp");
  EXPECT_EQ(a.size(), 6u);
  EXPECT_EQ(b.size(), 6u);
  if (a.size() != 6u || b.size() != 6u) return 1;
  EXPECT_LT(a.back(), a.front()) << "the loss must fall";
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << what << " step " << i + 1;
  const auto pa = model_of(f.ckpt("plain", 6)), pb = model_of(f.ckpt("pp", 6));
  EXPECT_EQ(pa.size(), pb.size());
  const double d = rel_diff(pb, pa);
  std::printf("%s over 2 islands of pp2 vs of one rank: parameters %.2e relative apart\n", what.c_str(), d);
  EXPECT_LT(d, 1e-4) << what;
  return d;
}

// Resumes run "cut" (stopped mid-round before this call) with `args` on `ranks` ranks and checks it
// ends as the uninterrupted run `full`: bit for bit the final model, island 1's copy and every
// step's loss.
static void resume_matches(IslandsPp& f, int ranks, const std::vector<std::string>& args, const std::string& full) {
  ASSERT_EQ(f.train("cut", ranks, with(args, {"--resume"})), 0);
  EXPECT_NE(f.log("cut").find("resumed from"), std::string::npos) << f.log("cut");
  EXPECT_EQ(rel_diff(model_of(f.ckpt("cut", 6)), model_of(f.ckpt(full, 6))), 0.0);
  EXPECT_EQ(rel_diff(island1_of(f.ckpt("cut", 6)), island1_of(f.ckpt(full, 6))), 0.0);
  const auto c = metric_values(f.root / full), e = metric_values(f.root / "cut");
  ASSERT_EQ(e.size(), 6u);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(e[i], c[i]) << full << " resumed, step " << i + 1;
}

// IsoLoCo over pipelined islands: each stage Iso-C-merges its own matrices after the average.
// merge_scope = "all" puts the tied embedding through Iso-C too, on both stages (its last-stage
// copy from the agreed pseudo-gradient), so the checkpoint's comparison of the two copies (the
// "tied copy" warning) checks they stay equal. Bound: the DiLoCo test's above, which the SVD's
// polar factor carries over (measured: printed); a stage merging another stage's matrices, or the
// tied copy left unmerged on the last stage, moves every outer step far past it.
TEST(IslandsPipeline, IsoLoCoWithPp2InsideTwoIslandsFollowsIsoLoCoWithoutPp) {
  IslandsPp f;
  const std::vector<std::string> iso = {"--lowcomm.method=isoloco", "--lowcomm.merge_scope=all", "--checkpoint.every=3"};
  ASSERT_EQ(f.train("plain", 2, iso), 0);
  ASSERT_EQ(f.train("pp", 4, with(iso, {"--parallel.pp=2"})), 0);
  const std::string log = f.log("pp");
  EXPECT_NE(log.find("islands: isoloco over 2 islands"), std::string::npos) << log;
  EXPECT_NE(log.find("merge iso_c (all matrices)"), std::string::npos) << log;
  double d = 1;
  ASSERT_NO_FATAL_FAILURE(d = pp_run_follows(f, "IsoLoCo (all matrices)"));
  const auto pa = model_of(f.ckpt("plain", 6));
  // The merge acted: plain DiLoCo on the same batches ends elsewhere.
  ASSERT_EQ(f.train("diloco", 2, {"--checkpoint.every=3"}), 0);
  const double m = rel_diff(model_of(f.ckpt("diloco", 6)), pa);
  std::printf("IsoLoCo vs DiLoCo after 2 outer steps: %.2e relative apart\n", m);
  EXPECT_GT(m, 100 * d) << "Iso-C changed nothing the test can see";
  for (int step : {3, 6}) EXPECT_EQ(rel_diff(island1_of(f.ckpt("pp", step)), model_of(f.ckpt("pp", step))), 0.0) << step;
}

// Streaming DiLoCo over pipelined islands: 2 fragments of the 2 blocks (fragment 0: block 0 and
// what lies outside the blocks; fragment 1: block 1), so stage 0 holds all of fragment 0 and none
// of fragment 1, and stage 1 block 1 plus fragment 0's final norm and tied copy. Overlap 1 step,
// mixing 0.5. Against the same job without pp: the DiLoCo test's bounds (the same rounding
// mechanism); the job's bytes are each stage's own pieces of each fragment. Then stopped at step 4
// (fragment 1's exchange pending on stage 1 only) and resumed: bit for bit.
TEST(IslandsPipeline, StreamingWithPp2InsideTwoIslandsFollowsStreamingWithoutPpAndResumes) {
  IslandsPp f;
  const std::vector<std::string> st = {"--lowcomm.method=streaming", "--lowcomm.fragments=2", "--lowcomm.overlap_steps=1",
                                       "--lowcomm.mixing=0.5", "--checkpoint.every=3"};
  ASSERT_EQ(f.train("plain", 2, st), 0);
  ASSERT_EQ(f.train("pp", 4, with(st, {"--parallel.pp=2"})), 0);
  const std::string log = f.log("pp");
  EXPECT_NE(log.find("islands: streaming over 2 islands"), std::string::npos) << log;
  EXPECT_NE(log.find("2 fragments"), std::string::npos) << log;
  double d = 1;
  ASSERT_NO_FATAL_FAILURE(d = pp_run_follows(f, "Streaming (2 fragments, overlap 1)"));
  const auto pa = model_of(f.ckpt("plain", 6)), pb = model_of(f.ckpt("pp", 6));
  const auto b = metric_values(f.root / "pp");
  // Streaming is not DiLoCo here: the same batches under DiLoCo end elsewhere.
  ASSERT_EQ(f.train("diloco", 2, {"--checkpoint.every=3"}), 0);
  EXPECT_GT(rel_diff(model_of(f.ckpt("diloco", 6)), pa), 100 * d);
  // Bytes: every fragment sync of the job carries each stage's own piece of the fragment.
  const auto ja = wan_bytes_of(f.root / "plain", "wan_bytes_job"), jb = wan_bytes_of(f.root / "pp", "wan_bytes_job");
  ASSERT_EQ(ja.size(), jb.size());
  ASSERT_GE(ja.size(), 3u);
  std::printf("job bytes across after %zu fragment syncs: %lld without pp, %lld with pp2\n", ja.size(),
              (long long)ja.back(), (long long)jb.back());
  // Exactly the tied copy (the lower root, padded to 16 elements per tensor) more per fragment-0
  // sync and island: stage 0 sends fragment 0 less the final norm, stage 1 the final norm and the
  // copy, and nothing of fragment 1 leaves stage 0.
  const TensorFile mf = load_safetensors((f.ckpt("pp", 6) / "model.safetensors").string());
  int64_t lower_padded = 0;
  for (auto& [n, t] : mf.tensors)
    if (n.find("wte") != std::string::npos || n.find("wpe") != std::string::npos) lower_padded += (t.numel() + 15) / 16 * 16;
  int64_t frag0_syncs = 0;
  {
    std::ifstream m(f.root / "pp" / "metrics.jsonl");
    for (std::string line; std::getline(m, line);)
      if (!line.empty())
        if (auto j = nlohmann::json::parse(line); j.contains("sync"))
          frag0_syncs += j.at("sync").value("what", "") == "fragment 0";
  }
  EXPECT_EQ(frag0_syncs, 2);
  EXPECT_EQ(jb.back(), ja.back() + frag0_syncs * 2 * 4 * lower_padded) << "each stage sends its own pieces";
  // Stopped at step 4 with fragment 1's exchange in flight, resumed: bit for bit.
  ASSERT_EQ(f.train("cut", 4, with(st, {"--parallel.pp=2", "--train.stop_after=4"})), 0);
  const TensorFile opt = optim_of(f.ckpt("cut", 4));
  EXPECT_NE(opt.find("lowcomm.pending.rank1.0"), nullptr) << "stage 1's pending exchange is not in the checkpoint";
  ASSERT_EQ(f.train("cut", 4, with(st, {"--parallel.pp=2", "--resume"})), 0);
  EXPECT_NE(f.log("cut").find("resumed from"), std::string::npos) << f.log("cut");
  EXPECT_EQ(rel_diff(model_of(f.ckpt("cut", 6)), pb), 0.0);
  EXPECT_EQ(rel_diff(island1_of(f.ckpt("cut", 6)), island1_of(f.ckpt("pp", 6))), 0.0);
  const auto e = metric_values(f.root / "cut");
  ASSERT_EQ(e.size(), 6u);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(e[i], b[i]) << "step " << i + 1;
}

// Stopped mid-round and resumed, with the int8 exchange (error feedback per rank, whose residuals
// have each stage's size): bit for bit the uninterrupted run. A resume without pp cannot take the
// per-stage outer state and is refused naming parallel.pp.
TEST(IslandsPipeline, StoppedAndResumedUnderPpIsBitExact) {
  IslandsPp f;
  const std::vector<std::string> pp = {"--parallel.pp=2", "--lowcomm.exchange=int8"};
  ASSERT_EQ(f.train("full", 4, pp), 0);
  ASSERT_EQ(f.train("cut", 4, with(pp, {"--train.stop_after=4"})), 0);
  ASSERT_EQ(f.train("cut", 4, with(pp, {"--resume"})), 0);
  EXPECT_NE(f.log("cut").find("resumed from"), std::string::npos) << f.log("cut");
  EXPECT_EQ(f.log("full").find("tied copy"), std::string::npos) << f.log("full");
  EXPECT_EQ(rel_diff(model_of(f.ckpt("cut", 6)), model_of(f.ckpt("full", 6))), 0.0);
  EXPECT_EQ(rel_diff(island1_of(f.ckpt("cut", 6)), island1_of(f.ckpt("full", 6))), 0.0);
  const auto c = metric_values(f.root / "full"), e = metric_values(f.root / "cut");
  ASSERT_EQ(c.size(), 6u);
  ASSERT_EQ(e.size(), 6u);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i], e[i]) << "step " << i + 1;
  EXPECT_NE(f.train("cut", 2, {"--lowcomm.exchange=int8", "--train.steps=8", "--resume"}, true), 0);
  EXPECT_NE(f.log("cut").find("resume with parallel.pp = 2"), std::string::npos) << f.log("cut");
}

// ZeRO-1 and ZeRO-2 inside pipelined islands (session 12): they shard the inner AdamW's state
// (and ZeRO-2 the gradients) over each stage's dp ranks, the parameters stay whole on every rank,
// so the exchange and the outer state are DiLoCo's under ddp. 2 islands of pp 2 x dp 2 (8 ranks)
// against 2 islands of 2 ddp ranks without pp, the same global batch: the DiLoCo test's bounds
// (dp's average of two half batches adds one rounding to the pipeline's).
TEST(IslandsPipeline, ZeroOneAndTwoInsidePipelinedIslandsFollowDdpWithoutPpAndResume) {
  IslandsPp f;
  ASSERT_EQ(f.train("ddp", 4, {"--checkpoint.every=6"}), 0);
  const auto a = metric_values(f.root / "ddp");
  ASSERT_EQ(a.size(), 6u);
  const auto pa = model_of(f.ckpt("ddp", 6));
  for (const char* z : {"zero1", "zero2"}) {
    ASSERT_EQ(f.train(z, 8, {"--parallel.pp=2", std::string("--parallel.strategy=") + z, "--checkpoint.every=3"}), 0);
    const std::string log = f.log(z);
    EXPECT_NE(log.find(std::string("(pp = 2) x ") + z + " over dp = 2"), std::string::npos) << log;
    const auto b = metric_values(f.root / z);
    ASSERT_EQ(b.size(), 6u) << z;
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i])) << z << " step " << i + 1;
    const double d = rel_diff(model_of(f.ckpt(z, 6)), pa);
    std::printf("DiLoCo over 2 islands of pp2 x %s (dp 2) vs of 2 ddp ranks: parameters %.2e relative apart\n", z, d);
    EXPECT_LT(d, 1e-4) << z;
    for (int step : {3, 6}) EXPECT_EQ(rel_diff(island1_of(f.ckpt(z, step)), model_of(f.ckpt(z, step))), 0.0) << z;
  }
  // ZeRO-1's sharded AdamW state and the per-stage outer state through a stop mid-round: resumed,
  // bit for bit the uninterrupted zero1 run.
  const std::vector<std::string> z1 = {"--parallel.pp=2", "--parallel.strategy=zero1", "--checkpoint.every=3"};
  ASSERT_EQ(f.train("cut", 8, with(z1, {"--train.stop_after=4"})), 0);
  resume_matches(f, 8, z1, "zero1");
}

// tp inside the stages of pipelined islands (session 13): 2 islands of pp 2 x tp 2 (8 ranks)
// against 2 islands of one rank, the same global batch; the DiLoCo test's bounds (tp's row-parallel
// sums add roundings of the same size as the pipeline's). The outer state is per (stage, tp shard),
// four pieces gathered by the island's pp x tp group; a run stopped mid-round resumes bit for bit.
TEST(IslandsPipeline, DiLoCoWithPp2TimesTp2InsideTwoIslandsFollowsOneRankIslandsAndResumes) {
  IslandsPp f;
  const std::vector<std::string> pptp = {"--parallel.pp=2", "--parallel.tp=2", "--checkpoint.every=3"};
  ASSERT_EQ(f.train("plain", 2, {"--checkpoint.every=6"}), 0);
  ASSERT_EQ(f.train("pp", 8, pptp), 0);
  ASSERT_NO_FATAL_FAILURE((void)pp_run_follows(f, "DiLoCo (pp2 x tp2)"));
  for (int step : {3, 6}) EXPECT_EQ(rel_diff(island1_of(f.ckpt("pp", step)), model_of(f.ckpt("pp", step))), 0.0) << step;
  const TensorFile opt = optim_of(f.ckpt("pp", 6));
  int64_t outer = 0;
  for (int r = 0; r < 4; ++r) {
    const Tensor* g = opt.find("lowcomm.pptp.rank" + std::to_string(r) + ".global");
    ASSERT_NE(g, nullptr) << "rank " << r << " of the pp x tp group";
    EXPECT_NE(opt.find("lowcomm.pptp.rank" + std::to_string(r) + ".momentum"), nullptr) << r;
    outer += g->numel();
  }
  EXPECT_EQ(opt.find("lowcomm.pp.rank0.global"), nullptr) << "the pp-only names are not used under pp x tp";
  // Four pieces of one model: more than the model (the tp-replicated norms and biases, the tied
  // copy), less than twice it.
  const size_t n = model_of(f.ckpt("pp", 6)).size();
  EXPECT_GT(outer, int64_t(n));
  EXPECT_LT(outer, 2 * int64_t(n));
  ASSERT_EQ(f.train("cut", 8, with(pptp, {"--train.stop_after=4"})), 0);
  resume_matches(f, 8, pptp, "pp");
}

// Streaming DiLoCo with tp inside the stages (the Streaming test's settings, 8 ranks): it follows
// the run without pp and tp by the same bounds, and stopped at step 4 with exchanges in flight on
// (stage, tp) pieces, resumes bit for bit; the pending exchanges are saved per pp x tp rank.
TEST(IslandsPipeline, StreamingWithPp2TimesTp2InsideTwoIslandsFollowsAndResumes) {
  IslandsPp f;
  const std::vector<std::string> st = {"--lowcomm.method=streaming", "--lowcomm.fragments=2", "--lowcomm.overlap_steps=1",
                                       "--lowcomm.mixing=0.5", "--checkpoint.every=3"};
  const std::vector<std::string> pptp = with(st, {"--parallel.pp=2", "--parallel.tp=2"});
  ASSERT_EQ(f.train("plain", 2, st), 0);
  ASSERT_EQ(f.train("pp", 8, pptp), 0);
  ASSERT_NO_FATAL_FAILURE((void)pp_run_follows(f, "Streaming (pp2 x tp2)"));
  ASSERT_EQ(f.train("cut", 8, with(pptp, {"--train.stop_after=4"})), 0);
  const TensorFile opt = optim_of(f.ckpt("cut", 4));
  int pending = 0;
  for (int r = 0; r < 4; ++r) pending += opt.find("lowcomm.pending.rank" + std::to_string(r) + ".0") != nullptr;
  EXPECT_GE(pending, 2) << "the stage holding fragment 1 has a pending exchange on each of its tp ranks";
  resume_matches(f, 8, pptp, "pp");
}

// cp inside the stages of pipelined islands (session 13): every stage's blocks run ring attention
// over the stage's cp group (docs/pipeline.md), whose ranks hold the stage whole and share its
// exchange as dp ranks do. 2 islands of pp 2 x cp 2 (8 ranks) against 2 islands of one rank:
// the DiLoCo test's bounds (cp's merged softmax blocks add roundings of the same size as the
// pipeline's; the cp islands test takes the same). Then with Iso-C on each stage's matrices.
TEST(IslandsPipeline, DiLoCoWithPp2TimesCp2InsideTwoIslandsFollowsOneRankIslandsAndResumes) {
  IslandsPp f;
  const std::vector<std::string> ppcp = {"--parallel.pp=2", "--parallel.cp=2", "--checkpoint.every=3"};
  ASSERT_EQ(f.train("plain", 2, {"--checkpoint.every=6"}), 0);
  ASSERT_EQ(f.train("pp", 8, ppcp), 0);
  ASSERT_NO_FATAL_FAILURE((void)pp_run_follows(f, "DiLoCo (pp2 x cp2)"));
  for (int step : {3, 6}) EXPECT_EQ(rel_diff(island1_of(f.ckpt("pp", step)), model_of(f.ckpt("pp", step))), 0.0) << step;
  // The cp ranks share each stage's exchange: rank 0 sends half its stage per outer step.
  const auto w = wan_bytes_of(f.root / "pp");
  ASSERT_EQ(w.size(), 2u);
  const TensorFile opt = optim_of(f.ckpt("pp", 6));
  const Tensor* g0 = opt.find("lowcomm.pp.rank0.global");
  ASSERT_NE(g0, nullptr);
  // (2 islands: the ring sends half a buffer twice, i.e. the buffer; 4 bytes an element.)
  EXPECT_EQ(w[0], 4 * ((g0->numel() + 1) / 2)) << "each cp rank sends half its stage, not all of it";
  ASSERT_EQ(f.train("cut", 8, with(ppcp, {"--train.stop_after=4"})), 0);
  resume_matches(f, 8, ppcp, "pp");
}

// IsoLoCo over islands of pp 2 x tp 2: each stage's tp group gathers its split matrices of the
// averaged pseudo-gradient whole, every tp rank merges them alike and keeps its piece (isoloco.cpp);
// against IsoLoCo over islands of one rank, the IsoLoCo test's bounds.
TEST(IslandsPipeline, IsoLoCoWithPp2TimesTp2InsideTwoIslandsFollowsOneRankIslands) {
  IslandsPp f;
  const std::vector<std::string> iso = {"--lowcomm.method=isoloco", "--lowcomm.merge_scope=all", "--checkpoint.every=6"};
  ASSERT_EQ(f.train("plain", 2, iso), 0);
  ASSERT_EQ(f.train("pp", 8, with(iso, {"--parallel.pp=2", "--parallel.tp=2"})), 0);
  ASSERT_NO_FATAL_FAILURE((void)pp_run_follows(f, "IsoLoCo (all matrices, pp2 x tp2)"));
}

// IsoLoCo and Streaming DiLoCo over islands of pp 2 x cp 2, each against itself over islands of
// one rank (their own tests' settings; the same bounds).
TEST(IslandsPipeline, IsoLoCoAndStreamingWithPp2TimesCp2InsideTwoIslandsFollowOneRankIslands) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> methods = {
      {"IsoLoCo (all matrices, pp2 x cp2)", {"--lowcomm.method=isoloco", "--lowcomm.merge_scope=all"}},
      {"Streaming (pp2 x cp2)", {"--lowcomm.method=streaming", "--lowcomm.fragments=2", "--lowcomm.overlap_steps=1",
                                 "--lowcomm.mixing=0.5"}}};
  for (const auto& [what, args] : methods) {
    IslandsPp f;
    ASSERT_EQ(f.train("plain", 2, with(args, {"--checkpoint.every=6"})), 0);
    ASSERT_EQ(f.train("pp", 8, with(args, {"--parallel.pp=2", "--parallel.cp=2", "--checkpoint.every=6"})), 0);
    ASSERT_NO_FATAL_FAILURE((void)pp_run_follows(f, what));
  }
}

TEST(IslandsPipeline, WhatDoesNotComposeIsRefusedBeforeStepOne) {
  IslandsPp f;
  struct Case {
    const char* run;
    int ranks;
    std::vector<std::string> args;
    const char* says;
  };
  for (const Case& c : {Case{"hsdp", 8, {"--parallel.pp=2", "--parallel.strategy=hsdp", "--parallel.hsdp_shard_size=2"},
                             "parallel.strategy = 'hsdp' with parallel.pp = 2 inside the islands"},
                        Case{"zero3", 8, {"--parallel.pp=2", "--parallel.strategy=zero3"},
                             "parallel.strategy = 'zero3' with parallel.pp = 2 inside the islands"}}) {
    EXPECT_NE(f.train(c.run, c.ranks, c.args, true), 0) << c.run;
    const std::string log = f.log(c.run);
    EXPECT_NE(log.find(c.says), std::string::npos) << log;
    EXPECT_EQ(log.find("step     1"), std::string::npos) << log;
  }
}
