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
  EXPECT_EQ(atl::read_shard(d + "/a.bin"), (std::vector<uint16_t>{0, 1, 256, 50256, 65535}));
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
    for (uint16_t t : atl::read_shard(f)) back.push_back(t);
  EXPECT_EQ(back, all);
  EXPECT_EQ(atl::read_shard(files[2]).size(), 5u);
  fs::remove_all(d);
}

}  // namespace
