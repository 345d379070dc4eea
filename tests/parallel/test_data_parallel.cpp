// Data parallelism against one rank: N ranks at per-rank batch b must end with the parameters one
// rank reaches at batch N*b (to 1e-6 relative), for every strategy, with every rank holding the
// same parameters; gradient accumulation without sync equals one big batch; uneven inputs finish.
#include <gtest/gtest.h>

#include "core/threads.h"
#include "harness.h"
#include "nn/gpt.h"
#include "parallel/flat_layout.h"

using namespace atl;
using namespace atl::parallel;
using namespace atl::parallel::test;

namespace {

// AdamW's first steps move each weight by about +-lr whatever its gradient's size, so a gradient
// that rounds to a different sign when summed in another order would move a weight by 2*lr; the
// harness uses eps = 1e-5 (harness.cpp; ATOLL_TEST_EPS overrides it), which keeps the update Lipschitz in the gradient for
// gradients below the rounding noise, so the comparison measures the parallelism, not Adam's
// sign function. Measured: ~1.5e-7 to 3e-7 at eps 1e-5, 5e-7 to 8e-7 at 1e-6, 3e-6 to 7e-6 at 1e-8.
constexpr double kTol = 1e-6;

std::vector<float> reference(int batch, int steps, int accum = 1) {
  set_num_threads(1);
  Job j;
  j.batch = batch;
  j.steps = steps;
  j.accum = accum;
  return run_job(nullptr, j);
}

void expect_matches(const std::string& strategy, int world, int hsdp = 0, int accum = 1) {
  Job j;
  j.strategy = strategy;
  j.batch = 2;
  j.steps = 3;
  j.accum = accum;
  j.hsdp_shard = hsdp;
  std::vector<float> dist = run_ranks(world, j);
  ASSERT_FALSE(dist.empty());
  std::vector<float> ref = reference(2 * world, 3, accum);
  std::vector<float> init = [] {
    Job z;
    z.steps = 0;
    return run_job(nullptr, z);
  }();
  double moved = rel_diff(ref, init);
  EXPECT_GT(moved, 1e-3) << "the reference did not train; the comparison would prove nothing";
  double d = rel_diff(dist, ref);
  std::printf("%s on %d ranks: relative difference to one rank %.2e\n", strategy.c_str(), world, d);
  EXPECT_LT(d, kTol) << strategy << " on " << world << " ranks";
}

}  // namespace

TEST(Layout, SizeBucketsCoverTheBufferInReverseAndDivideByShards) {
  nn::GPTConfig c = nn::GPTConfig::preset("gpt2-tiny");
  nn::GPT model(c);
  for (int shards : {1, 2, 3}) {
    FlatLayout L = size_buckets(model, 3000, shards, shards - 1);
    int64_t hi = model.flat_values().numel();
    ASSERT_GT(L.buckets.size(), 3u);
    for (size_t b = 0; b < L.buckets.size(); ++b) {
      const BucketLayout& B = L.buckets[b];
      EXPECT_EQ(B.range.hi, hi) << "buckets must tile the buffer from the top down";
      hi = B.range.lo;
      if (B.range.lo > 0) {
        EXPECT_EQ(B.range.size() % shards, 0);
      }
      EXPECT_EQ(B.chunk * shards >= B.range.size(), true);
      EXPECT_LE(B.own.hi, B.range.hi);
      // Every overlapping parameter is listed.
      for (size_t i = 0; i < L.spans.size(); ++i) {
        bool overlaps = L.spans[i].lo < B.range.hi && L.spans[i].hi > B.range.lo;
        bool listed = std::find(B.params.begin(), B.params.end(), int(i)) != B.params.end();
        EXPECT_EQ(overlaps, listed);
      }
    }
    EXPECT_EQ(hi, 0);
  }
}

TEST(Layout, UnitBucketsAreTheBlocksAndTheRoot) {
  nn::GPTConfig c = nn::GPTConfig::preset("gpt2-tiny");
  nn::GPT model(c);
  std::vector<int> bb, roots;
  FlatLayout L = unit_buckets(model, 2, 1, bb, roots);
  ASSERT_EQ(bb.size(), model.h.size());
  EXPECT_EQ(roots.size(), 2u);
  for (size_t k = 0; k < bb.size(); ++k) EXPECT_EQ(L.buckets[size_t(bb[k])].range.size(), model.h[k]->num_params());
}

TEST(DataParallel, DDPTwoRanksMatchesOneRankAtDoubleBatch) { expect_matches("ddp", 2); }
TEST(DataParallel, DDPThreeRanksMatchesOneRankAtTripleBatch) { expect_matches("ddp", 3); }
TEST(DataParallel, Zero1TwoRanks) { expect_matches("zero1", 2); }
TEST(DataParallel, Zero2ThreeRanks) { expect_matches("zero2", 3); }
TEST(DataParallel, Zero3TwoRanks) { expect_matches("zero3", 2); }
TEST(DataParallel, Zero3ThreeRanks) { expect_matches("zero3", 3); }
TEST(DataParallel, HsdpFourRanksShardTwo) { expect_matches("hsdp", 4, 2); }

// Accumulation micro-steps run without sync (a second synced backward would throw), and the
// averaged result equals one rank accumulating the same rows.
TEST(DataParallel, DDPAccumulationWithoutSyncEqualsOneBigBatch) { expect_matches("ddp", 2, 0, 3); }
TEST(DataParallel, Zero2AccumulationWithoutSync) { expect_matches("zero2", 2, 0, 2); }

TEST(DataParallel, UnevenInputsFinishWithoutDeadlock) {
  for (std::string s : {"ddp", "zero3"}) {
    Job j;
    j.strategy = s;
    j.batch = 2;
    j.steps = 6;
    j.data_steps = {4, 2};  // rank 0 has 4 batches, rank 1 has 2
    std::vector<float> dist = run_ranks(2, j, 60);
    ASSERT_FALSE(dist.empty()) << s;
    set_num_threads(1);
    std::vector<float> ref = run_job(nullptr, j);  // one rank: rows of 2 ranks, then of rank 0 only
    EXPECT_LT(rel_diff(dist, ref), kTol) << s;
  }
}
