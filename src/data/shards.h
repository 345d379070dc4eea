// Token shards in llm.c's format (Karpathy, llm.c, dev/data/data_common.py): a header of 256
// int32 (header[0] = 20240520 magic, header[1] = version 1, header[2] = number of tokens), then the
// tokens as little-endian uint16 — so vocabularies must have fewer than 65536 ids. Shards written
// here load in llm.c and vice versa.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atl {

constexpr int32_t kShardMagic = 20240520;
constexpr int32_t kShardVersion = 1;
constexpr int kShardHeaderInts = 256;
constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

// Writes one shard (atomically: a temporary file renamed into place). Fails if an id is negative
// or does not fit uint16.
void write_shard(const std::string& path, const int32_t* tokens, size_t n);
inline void write_shard(const std::string& path, const std::vector<int32_t>& t) {
  write_shard(path, t.data(), t.size());
}

// A shard mapped read-only into memory. The constructor validates the header and the file size
// and says what is wrong with a file that is not a shard.
class ShardReader {
 public:
  explicit ShardReader(const std::string& path);
  ~ShardReader();
  ShardReader(ShardReader&& o) noexcept;
  ShardReader& operator=(ShardReader&&) = delete;
  ShardReader(const ShardReader&) = delete;

  size_t size() const { return n_; }
  const uint16_t* data() const { return tokens_; }
  uint16_t operator[](size_t i) const { return tokens_[i]; }
  const std::string& path() const { return path_; }
  uint16_t max_token() const;  // scans the shard

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  size_t n_ = 0;
};

// Reads a whole shard into a vector (for small shards and tests).
std::vector<uint16_t> read_shard(const std::string& path);

// Splits a token stream into dir/<prefix>_000000.bin, _000001.bin, ... of at most shard_tokens
// tokens each.
class ShardSetWriter {
 public:
  ShardSetWriter(std::string dir, std::string prefix, size_t shard_tokens);
  void add(const int32_t* tokens, size_t n);
  void add(const std::vector<int32_t>& t) { add(t.data(), t.size()); }
  // Flushes the last shard; returns the files written (at least one, possibly empty).
  std::vector<std::string> finish();
  size_t total_tokens() const { return total_; }

 private:
  void flush();
  std::string dir_, prefix_;
  size_t shard_tokens_;
  std::vector<int32_t> buf_;
  std::vector<std::string> files_;
  size_t total_ = 0;
};

}  // namespace atl
