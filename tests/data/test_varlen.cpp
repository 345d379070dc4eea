// The variable-length corpus (data/varlen_corpus.h) and its packing (data/varlen_packer.h):
// documents kept whole (cut only past max_len, every token a target exactly once), batches of
// whole documents reaching batch_tokens, deterministic by batch index, each document once per
// epoch; Pareto lengths long-tailed within their bounds; first-fit-decreasing rows holding each
// document contiguously with its doc ids, padding that no loss counts, and balanced deals.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>

#include "core/error.h"
#include "data/shards.h"
#include "data/varlen_corpus.h"
#include "data/varlen_packer.h"

using namespace atl;

namespace {

constexpr int32_t kEot = 999;

// Documents of the given target counts, each an end-of-text id then distinct tokens.
std::vector<int32_t> stream_of(const std::vector<int>& targets) {
  std::vector<int32_t> s;
  int32_t next = 0;
  for (int n : targets) {
    s.push_back(kEot);
    for (int i = 0; i < n; ++i) s.push_back(next++);
  }
  return s;
}

VarlenOptions opts(int64_t batch, int64_t max_len) {
  VarlenOptions o;
  o.batch_tokens = batch;
  o.max_len = max_len;
  o.seed = 5;
  return o;
}

}  // namespace

TEST(VarlenCorpus, DocumentsStayWholeAndAreCutOnlyPastMaxLen) {
  VarlenCorpus c(stream_of({3, 10, 1, 25, 8}), kEot, opts(4, 8));
  // 10 -> 8 + 2 (a piece starts at the previous one's last target), 25 -> 8 + 8 + 8 + 1.
  EXPECT_EQ(c.lengths(), (std::vector<int64_t>{3, 8, 2, 1, 8, 8, 8, 1, 8}));
  // Over an epoch every token but the end-of-text ids is a target exactly once.
  std::map<int32_t, int> seen;
  int64_t k = 0;
  for (; k < c.batches_per_epoch(); ++k) {
    int64_t have = 0;
    auto b = c.batch(k);
    for (size_t d = 0; d < b.size(); ++d) {
      have += b[d].targets();
      if (d + 1 == b.size()) EXPECT_GE(have, 4) << "batch " << k << " ends once it holds batch_tokens";
      else EXPECT_LT(have, 4) << "batch " << k << " took a document past batch_tokens";
      for (size_t i = 1; i < b[d].tokens.size(); ++i) ++seen[b[d].tokens[i]];
    }
  }
  EXPECT_GT(k, 3);
  for (auto [t, n] : seen) EXPECT_EQ(n, 1) << "token " << t;
  // The remainder after the last full batch is dropped: at most one batch's worth minus one.
  EXPECT_GE(int64_t(seen.size()), 47 - 3);
}

TEST(VarlenCorpus, BatchesAreAFunctionOfSeedAndIndexAcrossEpochs) {
  std::vector<int> lens;
  for (int i = 0; i < 60; ++i) lens.push_back(1 + (i * 37) % 23);
  VarlenCorpus a(stream_of(lens), kEot, opts(50, 64)), b(stream_of(lens), kEot, opts(50, 64));
  const int64_t per_epoch = a.batches_per_epoch();
  ASSERT_GT(per_epoch, 3);
  // Read in different orders (b backwards, across epochs), the same batches come back.
  std::vector<std::vector<VarlenDocument>> fwd;
  for (int64_t k = 0; k < 3 * per_epoch; ++k) fwd.push_back(a.batch(k));
  for (int64_t k = 3 * per_epoch - 1; k >= 0; --k) {
    auto x = b.batch(k);
    ASSERT_EQ(x.size(), fwd[size_t(k)].size()) << "batch " << k;
    for (size_t d = 0; d < x.size(); ++d) EXPECT_EQ(x[d].tokens, fwd[size_t(k)][d].tokens) << "batch " << k;
  }
  // Epochs take the documents in different orders.
  EXPECT_NE(fwd[0][0].tokens, fwd[size_t(per_epoch)][0].tokens);
  VarlenOptions other = opts(50, 64);
  other.seed = 6;
  VarlenCorpus c(stream_of(lens), kEot, other);
  EXPECT_NE(c.batch(0)[0].tokens, fwd[0][0].tokens) << "another seed, another order";
}

TEST(VarlenCorpus, ParetoLengthsAreLongTailedWithinTheirBounds) {
  VarlenOptions o = opts(512, 2048);
  o.lengths = "pareto";
  o.alpha = 1.1;
  o.min_len = 16;
  std::vector<int32_t> s(400000);
  for (size_t i = 0; i < s.size(); ++i) s[i] = int32_t(i % 250);
  VarlenCorpus c(s, kEot, o);
  auto l = c.lengths();
  ASSERT_GT(l.size(), 1000u);
  for (int64_t x : l) ASSERT_TRUE(x >= 16 && x <= 2048) << x;
  std::sort(l.begin(), l.end());
  const int64_t median = l[l.size() / 2], longest = l.back();
  const double tail = double(std::accumulate(l.end() - int64_t(l.size() / 20), l.end(), int64_t(0))) /
                      double(std::accumulate(l.begin(), l.end(), int64_t(0)));
  std::printf("pareto alpha 1.1: %zu documents, median %ld, longest %ld, longest 5%% hold %.0f%% of the tokens\n",
              l.size(), long(median), long(longest), 100 * tail);
  EXPECT_LE(median, 40);  // 16 * 2^(1/1.1) = 30
  EXPECT_EQ(longest, 2048);
  EXPECT_GT(tail, 0.3) << "the tail must hold a good part of the tokens";
  // Bad settings are refused with what is wrong.
  o.min_len = 4096;
  EXPECT_THROW({ VarlenCorpus bad(s, kEot, o); }, Error);
  o = opts(int64_t(1) << 30, 64);
  try {
    VarlenCorpus small(stream_of({3, 4}), kEot, o);
    ADD_FAILURE() << "a batch larger than the corpus was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fewer than one batch"), std::string::npos) << e.what();
  }
}

TEST(VarlenCorpus, ReadsPreparedShards) {
  const std::string d = ::testing::TempDir() + "atoll_varlen_" + std::to_string(::getpid());
  std::filesystem::create_directories(d);
  write_shard(d + "/train_000000.bin", stream_of({5, 7}));
  write_shard(d + "/train_000001.bin", stream_of({9}));
  write_shard(d + "/val_000000.bin", stream_of({100}));
  VarlenCorpus c = VarlenCorpus::from_shards(d, "train", kEot, opts(1, 64));
  auto l = c.lengths();
  EXPECT_EQ(l, (std::vector<int64_t>{5, 7, 9}));
  EXPECT_THROW(VarlenCorpus::from_shards(d, "test", kEot, opts(1, 64)), Error);
  std::filesystem::remove_all(d);
}

TEST(VarlenPacker, RowsHoldWholeDocumentsWithTheirIds) {
  std::vector<VarlenDocument> docs;
  int32_t next = 0;
  for (int n : {5, 30, 12, 18, 3, 30, 7}) {
    VarlenDocument d;
    for (int i = 0; i <= n; ++i) d.tokens.push_back(next++);
    docs.push_back(d);
  }
  auto rows = pack_documents(docs);  // rows of 30, the longest
  // First-fit decreasing: 30 | 30 | 18+12 | 7+5+3.
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].used(), 30);
  EXPECT_EQ(rows[2].doc_lengths, (std::vector<int64_t>{18, 12}));
  EXPECT_EQ(rows[3].doc_lengths, (std::vector<int64_t>{7, 5, 3}));
  int64_t targets = 0;
  for (auto& r : rows) {
    ASSERT_LE(r.used(), 30);
    // Each document contiguous: inputs and targets shifted by one, ids a run per document.
    int64_t at = 0;
    for (size_t d = 0; d < r.doc_lengths.size(); ++d) {
      for (int64_t i = 0; i < r.doc_lengths[d]; ++i) {
        EXPECT_EQ(r.doc_ids[size_t(at + i)], int32_t(d));
        EXPECT_EQ(r.target[size_t(at + i)], r.input[size_t(at + i)] + 1);
        EXPECT_EQ(r.positions[size_t(at + i)], int32_t(i)) << "positions restart at every document";
      }
      at += r.doc_lengths[d];
    }
    targets += r.used();
  }
  EXPECT_EQ(targets, 5 + 30 + 12 + 18 + 3 + 30 + 7);
  // Padded tensors: targets -1 and ids -1 past a row's use, one row of padding for none.
  PackedTensors t = rows_to_tensors(rows, {3, 1}, 32);
  EXPECT_EQ(t.input.shape(), (Shape{2, 32}));
  EXPECT_EQ(t.targets, 15 + 30);
  EXPECT_EQ(t.target.i32()[15], -1);
  EXPECT_EQ(t.doc_ids.i32()[15], -1);
  EXPECT_EQ(t.doc_ids.i32()[14], 2);
  EXPECT_EQ(t.target.i32()[32 + 29], rows[1].target[29]);
  // Positions: row 3 is 7 + 5 + 3, then padding counting on from the last document's 2.
  EXPECT_EQ(t.positions.i32()[7], 0);
  EXPECT_EQ(t.positions.i32()[12], 0);
  EXPECT_EQ(t.positions.i32()[14], 2);
  EXPECT_EQ(t.positions.i32()[15], 3);
  EXPECT_EQ(t.positions.i32()[31], 19);
  EXPECT_EQ(t.positions.i32()[32 + 29], 29);
  EXPECT_EQ(t.positions.i32()[32 + 30], 30);
  PackedTensors none = rows_to_tensors(rows, {}, 4);
  EXPECT_EQ(none.targets, 0);
  EXPECT_EQ(none.input.shape(), (Shape{1, 4}));
  EXPECT_EQ(none.positions.i32()[3], 3);
  EXPECT_THROW(rows_to_tensors(rows, {0}, 16), Error);
  EXPECT_THROW(pack_documents(docs, 20), Error);
}

TEST(VarlenPacker, DealsRowsInBalancedBins) {
  std::vector<VarlenDocument> docs;
  for (int n : {100, 90, 60, 50, 40, 30, 20, 10, 10, 5}) docs.push_back({std::vector<int32_t>(size_t(n) + 1, 1)});
  auto rows = pack_documents(docs, 100);
  std::vector<int64_t> all(rows.size());
  std::iota(all.begin(), all.end(), int64_t(0));
  for (int64_t parts : {1, 2, 3, 8}) {
    auto bins = balance_rows(rows, all, parts, 0.0);
    ASSERT_EQ(int64_t(bins.size()), parts);
    std::vector<int> seen(rows.size(), 0);
    double lo = 1e30, hi = 0, biggest = 0;
    for (auto& b : bins) {
      double load = 0;
      for (int64_t i : b) ++seen[size_t(i)], load += rows[size_t(i)].cost(0.0);
      EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
      lo = std::min(lo, load), hi = std::max(hi, load);
    }
    for (auto& r : rows) biggest = std::max(biggest, r.cost(0.0));
    for (int n : seen) EXPECT_EQ(n, 1) << "every row in exactly one bin";
    // Greedy least-loaded dealing of rows in decreasing order: bins differ by at most one row.
    EXPECT_LE(hi - lo, biggest) << parts << " bins";
  }
  // The quadratic term weighs a row of one long document above a row as full of short ones.
  PackedRow one, ten;
  one.input.resize(100), one.doc_lengths = {100};
  ten.input.resize(100), ten.doc_lengths = std::vector<int64_t>(10, 10);
  EXPECT_DOUBLE_EQ(one.cost(0.01), 200.0);
  EXPECT_DOUBLE_EQ(ten.cost(0.01), 110.0);
}
