// Data-Centric Parallel's chooser (plan/data_centric.h): a batch of many short sequences gets pure
// data parallelism, one long sequence context parallelism; the choice is the fastest fitting
// candidate of plan's cost model; over a long-tailed mix of batches choosing per batch is never
// slower (predicted) than the best static configuration, and here strictly faster.
#include <gtest/gtest.h>

#include <cstdio>

#include "plan/data_centric.h"
#include "plan/hardware.h"

using namespace atl;
using namespace atl::plan;

namespace {
DcpJob job() {
  DcpJob j;
  ModelSpec& m = j.model;  // a Llama-like 1.3B model
  m.layers = 24, m.hidden = 2048, m.heads = 16, m.kv_heads = 16, m.ffn = 5504;
  m.ffn_type = "swiglu", m.vocab = 32000, m.tied_head = false, m.bias = false, m.norm = "rmsnorm";
  m.position = "rope";
  j.cluster = make_cluster(find_device("h100-sxm"), 8, 1, 1);
  j.world = 8;
  return j;
}
}  // namespace

TEST(DataCentricParallel, ShortBatchesGetDataParallelismLongOnesContextParallelism) {
  const DcpJob j = job();
  const std::vector<int64_t> shorts(64, 2048), longest = {131072};
  const DcpChoice s = choose_dcp(j, shorts), l = choose_dcp(j, longest);
  std::printf("short batch: %s\nlong batch:  %s\n", s.describe().c_str(), l.describe().c_str());
  EXPECT_EQ(s.cp, 1) << s.describe();
  EXPECT_GT(l.cp, 1) << l.describe();
  EXPECT_FALSE(s.same_config(l));
  // Each is the fastest candidate that fits.
  for (const auto& [lengths, c] : {std::pair{shorts, s}, std::pair{longest, l}}) {
    EXPECT_TRUE(c.fits);
    for (const DcpChoice& o : dcp_candidates(j, lengths))
      if (o.fits) {
        EXPECT_LE(c.step_s, o.step_s) << c.describe() << " vs " << o.describe();
      }
  }
  // The long sequence does not fit one device's memory without context parallelism and recompute
  // of everything: its cp = 1 candidates are all over memory or slower.
  bool cp1_fits = false;
  for (const DcpChoice& o : dcp_candidates(j, longest)) cp1_fits |= o.cp == 1 && o.fits && o.step_s <= l.step_s;
  EXPECT_FALSE(cp1_fits);
}

TEST(DataCentricParallel, PerBatchChoiceBeatsTheBestStaticConfiguration) {
  const DcpJob j = job();
  // Long-tailed lengths: most batches are many short documents, a few hold one very long one.
  std::vector<std::vector<int64_t>> batches;
  for (int i = 0; i < 12; ++i) batches.push_back(std::vector<int64_t>(64, 1024 + 256 * (i % 4)));
  batches.push_back({65536, 4096});
  batches.push_back({131072});
  double static_s = 0, dcp_s = 0;
  const DcpChoice st = best_static(j, batches, &static_s);
  for (auto& b : batches) dcp_s += choose_dcp(j, b).step_s;
  std::printf("static %s: %.3f s; data-centric: %.3f s (%.2fx)\n", st.describe().c_str(), static_s, dcp_s,
              static_s / dcp_s);
  EXPECT_LE(dcp_s, static_s * (1 + 1e-12));
  EXPECT_LT(dcp_s, static_s) << "the mix should reward choosing per batch";
}

// A batch is priced as the trainer packs and runs it (plan/data_centric.h), not as sequences
// padded to its longest: 16 documents of 256 beside one of 4096 pack into a second row whose
// attention is 16·256² (1/16 of the first row's), so the batch costs less than two documents of
// 4096 and more than the long one alone. Priced padded (the chooser before session 8) the batch
// was 17 sequences of 4096, far above two. (Rows are as long as the batch's longest document:
// 16 documents of 256 alone make 16 rows.)
TEST(DataCentricParallel, ABatchIsPricedAsItsPackedRows) {
  DcpJob j = job();
  j.recompute = {"none"};
  std::vector<int64_t> mixed(16, 256);
  mixed.insert(mixed.begin() + 5, 4096);
  const auto rows = pack_lengths(mixed);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], RowLengths{4096});
  EXPECT_EQ(rows[1], RowLengths(16, 256));
  EXPECT_EQ(pack_lengths(std::vector<int64_t>(16, 256)).size(), 16u) << "rows as long as the longest document";
  // One micro-batch of both rows: padded to 4096, attention the mean over rows of Σ len².
  const ModelSpec m = dcp_micro_batch_spec(j.model, rows, {0, 1}, dcp_micro_batch_len(rows, {0, 1}, 1));
  EXPECT_EQ(m.seq, 4096);
  EXPECT_DOUBLE_EQ(m.attention_sq_len, (4096.0 * 4096 + 16.0 * 256 * 256) / 2);
  EXPECT_EQ(dcp_micro_batch_len(rows, {1}, 4), 4096);
  EXPECT_EQ(dcp_micro_batch_len({{100}}, {0}, 4), 104) << "rounded to 2cp";
  j.world = 1;
  j.cluster = make_cluster(find_device("h100-sxm"), 1, 1, 1);
  const double t_mixed = predict_config(j, mixed, 1, 1, "none").step_s,
               t_two = predict_config(j, {4096, 4096}, 1, 1, "none").step_s,
               t_one = predict_config(j, {4096}, 1, 1, "none").step_s;
  std::printf("one 4096: %.4g ms, 4096 + 16 x 256: %.4g ms, 2 x 4096: %.4g ms\n", t_one * 1e3, t_mixed * 1e3,
              t_two * 1e3);
  EXPECT_LT(t_mixed, t_two) << "16 documents of 256 priced as a row of 4096";
  EXPECT_GT(t_mixed, t_one);
  // The choice follows the packed price: on 8 ranks, each candidate is price_packed of the rows,
  // and the chosen one is the fastest that fits.
  j = job();
  const DcpChoice c = choose_dcp(j, mixed);
  for (const DcpChoice& o : dcp_candidates(j, mixed)) {
    const DcpChoice p = price_packed(j, pack_lengths(mixed), o.cp, o.accum, o.recompute);
    EXPECT_EQ(o.step_s, p.step_s) << o.describe();
    if (o.fits) {
      EXPECT_LE(c.step_s, o.step_s) << c.describe() << " vs " << o.describe();
    }
  }
}
