// llm.c token shards: exact byte layout, round trips, and the errors for damaged files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/shards.h"

namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& tag) {
  std::string d = ::testing::TempDir() + "atoll_shards_" + tag + "_" + std::to_string(::getpid());
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string write_variant_for_test(const std::string& d, const std::string& name,
                                   const std::string& bytes) {
  std::ofstream(d + "/" + name, std::ios::binary) << bytes;
  return d + "/" + name;
}

void expect_error(const std::string& path, const std::string& needle) {
  try {
    atl::ShardReader r(path);
    FAIL() << "expected an error for " << path;
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DataShards, ByteLayoutIsLlmcs) {
  std::string d = temp_dir("layout");
  std::vector<int32_t> toks = {0, 1, 256, 50256, 65535};
  atl::write_shard(d + "/a.bin", toks);
  std::string raw = slurp(d + "/a.bin");
  ASSERT_EQ(raw.size(), 1024u + 2 * toks.size());
  int32_t h[256];
  std::memcpy(h, raw.data(), sizeof(h));
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], 5);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(h[i], 0);
  const unsigned char* t = reinterpret_cast<const unsigned char*>(raw.data()) + 1024;
  EXPECT_EQ(t[6] | (t[7] << 8), 50256);  // little-endian uint16
  EXPECT_EQ(atl::read_shard(d + "/a.bin"), (std::vector<uint32_t>{0, 1, 256, 50256, 65535}));
  atl::ShardReader r(d + "/a.bin");
  EXPECT_EQ(r.size(), 5u);
  EXPECT_EQ(r.max_token(), 65535);
  fs::remove_all(d);
}

TEST(DataShards, RejectsIdsThatDoNotFitUint16) {
  std::string d = temp_dir("big");
  EXPECT_THROW(atl::write_shard(d + "/a.bin", std::vector<int32_t>{1, 65536}), atl::Error);
  EXPECT_THROW(atl::write_shard(d + "/a.bin", std::vector<int32_t>{-1}), atl::Error);
  EXPECT_FALSE(fs::exists(d + "/a.bin"));
  fs::remove_all(d);
}

TEST(DataShards, DamagedFilesAreExplained) {
  std::string d = temp_dir("bad");
  std::vector<int32_t> toks(100, 7);
  atl::write_shard(d + "/good.bin", toks);
  std::string good = slurp(d + "/good.bin");

  auto write_variant = [&](const std::string& name, std::string bytes) {
    std::ofstream(d + "/" + name, std::ios::binary) << bytes;
    return d + "/" + name;
  };
  std::string magic = good;
  int32_t m = 20240326;
  std::memcpy(magic.data(), &m, 4);
  expect_error(write_variant("magic.bin", magic), "magic number 20240326");
  std::string version = good;
  int32_t v = 2;
  std::memcpy(version.data() + 4, &v, 4);
  expect_error(write_variant("version.bin", version), "version 2");
  expect_error(write_variant("trunc.bin", good.substr(0, good.size() - 10)), "truncated");
  expect_error(write_variant("short.bin", good.substr(0, 100)), "shorter than");
  expect_error(d + "/missing.bin", "cannot open");
  EXPECT_NO_THROW(atl::ShardReader(d + "/good.bin"));
  fs::remove_all(d);
}

// llm.c's uint32 kind (its "llama-3" files: magic 20240801, version 7), for vocabularies past
// 65536 ids; read whether written here or by llm.c (the header is built by hand below).
TEST(DataShards, Uint32ShardsHoldIdsPast65535) {
  std::string d = temp_dir("u32");
  EXPECT_EQ(atl::shard_token_bytes(257), 2);
  EXPECT_EQ(atl::shard_token_bytes(65536), 2);  // ids 0..65535 still fit uint16
  EXPECT_EQ(atl::shard_token_bytes(65537), 4);
  EXPECT_EQ(atl::shard_token_bytes(128256), 4);
  std::vector<int32_t> toks = {0, 65535, 65536, 128255, 2147483647};
  atl::write_shard(d + "/a.bin", toks, 4);
  std::string raw = slurp(d + "/a.bin");
  ASSERT_EQ(raw.size(), 1024u + 4 * toks.size());
  int32_t h[3];
  std::memcpy(h, raw.data(), sizeof(h));
  EXPECT_EQ(h[0], 20240801);
  EXPECT_EQ(h[1], 7);
  EXPECT_EQ(h[2], 5);
  const unsigned char* t = reinterpret_cast<const unsigned char*>(raw.data()) + 1024;
  EXPECT_EQ(t[8] | (t[9] << 8) | (t[10] << 16) | (t[11] << 24), 65536);  // little-endian uint32
  EXPECT_EQ(atl::read_shard(d + "/a.bin"),
            (std::vector<uint32_t>{0, 65535, 65536, 128255, 2147483647u}));
  atl::ShardReader r(d + "/a.bin");
  EXPECT_EQ(r.token_bytes(), 4);
  EXPECT_EQ(r.max_token(), 2147483647u);
  std::vector<int32_t> part(2);
  r.read(2, 2, part.data());
  EXPECT_EQ(part, (std::vector<int32_t>{65536, 128255}));

  // A file laid out as llm.c writes one.
  std::string hand(1024 + 8, '\0');
  int32_t hh[3] = {20240801, 7, 2};
  std::memcpy(hand.data(), hh, sizeof(hh));
  uint32_t ids[2] = {100000, 3};
  std::memcpy(hand.data() + 1024, ids, sizeof(ids));
  std::ofstream(d + "/llmc.bin", std::ios::binary) << hand;
  EXPECT_EQ(atl::read_shard(d + "/llmc.bin"), (std::vector<uint32_t>{100000, 3}));
  // Its size is checked at four bytes a token: a uint16-sized body is truncated.
  expect_error(write_variant_for_test(d, "short32.bin", hand.substr(0, 1024 + 4)), "truncated");
  hh[1] = 2;
  std::memcpy(hand.data(), hh, sizeof(hh));
  expect_error(write_variant_for_test(d, "v2.bin", hand), "version 2");
  // Negative ids never fit; ids past 65535 are refused in uint16 shards, saying what is needed.
  EXPECT_THROW(atl::write_shard(d + "/n.bin", std::vector<int32_t>{-1}, 4), atl::Error);
  try {
    atl::write_shard(d + "/b.bin", std::vector<int32_t>{70000}, 2);
    FAIL() << "expected an error";
  } catch (const atl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("uint32"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
}

TEST(DataShards, Uint32ShardSetsSplitAStream) {
  std::string d = temp_dir("set32");
  atl::ShardSetWriter w(d, "train", 3, 4);
  std::vector<int32_t> all = {70000, 1, 2, 99999, 65536};
  w.add(all);
  auto files = w.finish();
  ASSERT_EQ(files.size(), 2u);
  std::vector<int32_t> back;
  for (const auto& f : files) {
    EXPECT_EQ(atl::ShardReader(f).token_bytes(), 4);
    for (uint32_t t : atl::read_shard(f)) back.push_back(int32_t(t));
  }
  EXPECT_EQ(back, all);
  fs::remove_all(d);
}

TEST(DataShards, ShardSetSplitsAStream) {
  std::string d = temp_dir("set");
  atl::ShardSetWriter w(d, "train", 10);
  std::vector<int32_t> all;
  for (int i = 0; i < 25; ++i) all.push_back(i);
  w.add(all.data(), 7);
  w.add(all.data() + 7, 18);
  auto files = w.finish();
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(fs::path(files[0]).filename(), "train_000000.bin");
  EXPECT_EQ(fs::path(files[2]).filename(), "train_000002.bin");
  std::vector<int32_t> back;
  for (const auto& f : files)
    for (uint32_t t : atl::read_shard(f)) back.push_back(int32_t(t));
  EXPECT_EQ(back, all);
  EXPECT_EQ(atl::read_shard(files[2]).size(), 5u);
  fs::remove_all(d);
}

}  // namespace
