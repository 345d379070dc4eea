// Data loader: shifted targets, determinism, disjoint ranks covering an epoch, exact resume,
// unshuffled validation, and the errors for missing data or a too-small vocabulary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "core/error.h"
#include "data/data_loader.h"
#include "data/shards.h"

namespace {

namespace fs = std::filesystem;

// Three train shards of uneven length whose i-th token is 10000 * shard + i (so a window's first
// token names it, and a window running across a shard boundary would break the +1 pattern), and
// one val shard.
std::string make_data(const std::string& tag) {
  std::string d = ::testing::TempDir() + "atoll_loader_" + tag + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  for (int s = 0; s < 3; ++s) {
    std::vector<int32_t> t(size_t(1000 + 333 * s));
    for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t(10000 * s + i);
    atl::write_shard(d + "/train_00000" + std::to_string(s) + ".bin", t);
  }
  std::vector<int32_t> v(500);
  for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t(40000 + i);
  atl::write_shard(d + "/val_000000.bin", v);
  return d;
}

constexpr int B = 4, T = 16;

std::vector<int32_t> batch(atl::DataLoader& l, std::vector<int32_t>* tgt = nullptr) {
  std::vector<int32_t> in(B * T), tg(B * T);
  l.next_batch(in.data(), tg.data());
  if (tgt) *tgt = tg;
  return in;
}

TEST(DataLoader, TargetsAreInputsShiftedByOne) {
  std::string d = make_data("shift");
  atl::DataLoader l(d, "train", B, T, 0, 1, 5);
  // Windows per shard: (1000-1)/16 + (1333-1)/16 + (1666-1)/16 = 62 + 83 + 104.
  EXPECT_EQ(l.num_windows(), 249u);
  EXPECT_EQ(l.num_tokens(), 3999u);
  for (int k = 0; k < 5; ++k) {
    std::vector<int32_t> tg;
    auto in = batch(l, &tg);
    for (int b = 0; b < B; ++b) {
      // Consecutive positions within a window, and window starts are multiples of T in a shard.
      for (int t = 0; t < T; ++t) EXPECT_EQ(tg[size_t(b * T + t)], in[size_t(b * T + t)] + 1);
    }
  }
  fs::remove_all(d);
}

TEST(DataLoader, DeterministicForASeedAndShuffled) {
  std::string d = make_data("det");
  atl::DataLoader a(d, "train", B, T, 0, 1, 42), b(d, "train", B, T, 0, 1, 42),
      c(d, "train", B, T, 0, 1, 43);
  bool differs = false;
  for (int k = 0; k < 10; ++k) {
    auto x = batch(a), y = batch(b), z = batch(c);
    EXPECT_EQ(x, y);
    differs |= x != z;
  }
  EXPECT_TRUE(differs) << "another seed should give another order";
  fs::remove_all(d);
}

TEST(DataLoader, RanksAreDisjointAndCoverTheEpoch) {
  std::string d = make_data("ranks");
  const int world = 3;
  std::vector<std::unique_ptr<atl::DataLoader>> ls;
  for (int r = 0; r < world; ++r)
    ls.push_back(std::make_unique<atl::DataLoader>(d, "train", 1, T, r, world, 9));
  const uint64_t rows = ls[0]->rows_per_epoch();
  EXPECT_EQ(rows, 249u / 3);
  std::set<int32_t> seen;
  for (int r = 0; r < world; ++r)
    for (uint64_t k = 0; k < rows; ++k) {
      std::vector<int32_t> in(T), tg(T);
      ls[size_t(r)]->next_batch(in.data(), tg.data());
      EXPECT_TRUE(seen.insert(in[0]).second) << "window starting at " << in[0] << " seen twice";
    }
  EXPECT_EQ(seen.size(), 249u);  // every window of the epoch, once (249 = 3 * 83)
  // The next row starts epoch 1.
  std::vector<int32_t> in(T), tg(T);
  ls[0]->next_batch(in.data(), tg.data());
  EXPECT_EQ(ls[0]->epoch(), 1u);
  fs::remove_all(d);
}

TEST(DataLoader, ResumesAtTheExactPosition) {
  std::string d = make_data("resume");
  atl::DataLoader a(d, "train", B, T, 1, 2, 77);
  for (int k = 0; k < 40; ++k) batch(a);  // past the end of epoch 0 (124 rows per rank)
  nlohmann::json saved = a.state().to_json();
  EXPECT_EQ(saved["epoch"], 1);
  std::vector<std::vector<int32_t>> expect;
  for (int k = 0; k < 50; ++k) expect.push_back(batch(a));

  atl::DataLoader b(d, "train", B, T, 1, 2, 77);
  b.set_state(atl::DataLoaderState::from_json(saved));
  for (int k = 0; k < 50; ++k) EXPECT_EQ(batch(b), expect[size_t(k)]) << "batch " << k;

  // A state from other data or another rank is refused.
  atl::DataLoader other_t(d, "train", B, T + 1, 1, 2, 77);
  EXPECT_THROW(other_t.set_state(atl::DataLoaderState::from_json(saved)), atl::Error);
  atl::DataLoader other_rank(d, "train", B, T, 0, 2, 77);
  EXPECT_THROW(other_rank.set_state(atl::DataLoaderState::from_json(saved)), atl::Error);
  fs::remove_all(d);
}

TEST(DataLoader, ValidationIsSequentialAndResets) {
  std::string d = make_data("val");
  atl::DataLoader v(d, "val", 2, T, 0, 1, 1);
  EXPECT_EQ(v.num_windows(), 499u / T);
  atl::DataLoader& w = v;
  std::vector<int32_t> in(2 * T), tg(2 * T);
  w.next_batch(in.data(), tg.data());
  EXPECT_EQ(in[0], 40000);
  EXPECT_EQ(in[T], 40000 + T);
  w.next_batch(in.data(), tg.data());
  EXPECT_EQ(in[0], 40000 + 2 * T);
  w.reset();
  w.next_batch(in.data(), tg.data());
  EXPECT_EQ(in[0], 40000);
  EXPECT_EQ(w.batches_per_epoch(), (499u / T) / 2);
  fs::remove_all(d);
}

TEST(DataLoader, VocabTooSmallIsAnError) {
  std::string d = make_data("vocab");
  atl::DataLoader l(d, "train", B, T, 0, 1, 1);
  EXPECT_NO_THROW(l.validate_vocab(50000));
  try {
    l.validate_vocab(1000);
    FAIL() << "expected an error";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab size is 1000"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

// Batches from uint32 shards carry ids past 65535 unchanged, and the vocabulary check still
// names the shard, the id and the vocab size.
TEST(DataLoader, ReadsUint32Shards) {
  std::string d = ::testing::TempDir() + "atoll_loader_u32_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  std::vector<int32_t> t(200);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t(100000 + i);
  atl::write_shard(d + "/train_000000.bin", t, 4);
  atl::DataLoader l(d, "train", 1, T, 0, 1, 1);
  std::vector<int32_t> in(T), tg(T);
  l.next_batch(in.data(), tg.data());
  EXPECT_GE(in[0], 100000);
  for (int i = 0; i < T; ++i) EXPECT_EQ(tg[size_t(i)], in[size_t(i)] + 1);
  EXPECT_NO_THROW(l.validate_vocab(100200));
  try {
    l.validate_vocab(100199);
    FAIL() << "expected an error";
  } catch (const atl::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("train_000000.bin holds token id 100199"), std::string::npos) << m;
    EXPECT_NE(m.find("vocab size is 100199"), std::string::npos) << m;
  }
  fs::remove_all(d);
}

TEST(DataLoader, MissingDataSaysToPrepareIt) {
  try {
    atl::DataLoader l("/nonexistent/atoll-data", "train", B, T);
    FAIL() << "expected an error";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("atoll data prepare"), std::string::npos) << e.what();
  }
  std::string d = make_data("glob");
  atl::DataLoader g(d + "/train_*.bin", "train", B, T, 0, 1, 3);
  EXPECT_EQ(g.files().size(), 3u);
  EXPECT_THROW(atl::DataLoader(d, "train", B, 4000, 0, 1, 3), atl::Error);  // T too long
  fs::remove_all(d);
}

}  // namespace
