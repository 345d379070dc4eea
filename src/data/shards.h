// Token shards in llm.c's format (Karpathy, llm.c, dev/data/data_common.py): a header of 256
// int32 (header[0] = magic, header[1] = version, header[2] = number of tokens), then the tokens,
// little-endian. Two kinds, told apart by the magic:
//   20240520, version 1: uint16 tokens (llm.c's "gpt-2" files), for vocabularies up to 65536 ids;
//   20240801, version 7: uint32 tokens (llm.c's "llama-3" files), for larger vocabularies.
// Shards written here load in llm.c and vice versa.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atl {

constexpr int32_t kShardMagic = 20240520;  // uint16 tokens
constexpr int32_t kShardVersion = 1;
constexpr int32_t kShardMagicU32 = 20240801;  // uint32 tokens
constexpr int32_t kShardVersionU32 = 7;
constexpr int kShardHeaderInts = 256;
constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);

// Bytes per token the shards of a vocabulary need: 2 up to 65536 ids, 4 above.
int shard_token_bytes(int64_t vocab_size);

// What a valid header says.
struct ShardHeader {
  size_t tokens = 0;
  int token_bytes = 2;
};

// Validates the header of a shard whose whole content is bytes[0, size) (the file size must match
// the header's count); fails naming `path` and what is wrong. The one parser of shard files.
ShardHeader parse_shard_header(const void* bytes, size_t size, const std::string& path);

// Writes one shard of token_bytes (2 or 4) per token, atomically (a temporary file renamed into
// place). Fails if an id is negative or does not fit.
void write_shard(const std::string& path, const int32_t* tokens, size_t n, int token_bytes = 2);
inline void write_shard(const std::string& path, const std::vector<int32_t>& t,
                        int token_bytes = 2) {
  write_shard(path, t.data(), t.size(), token_bytes);
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
  int token_bytes() const { return token_bytes_; }
  uint32_t operator[](size_t i) const {
    return token_bytes_ == 2 ? uint32_t(static_cast<const uint16_t*>(tokens_)[i])
                             : static_cast<const uint32_t*>(tokens_)[i];
  }
  // Copies tokens [first, first + n) to out.
  void read(size_t first, size_t n, int32_t* out) const;
  const std::string& path() const { return path_; }
  uint32_t max_token() const;  // scans the shard

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* tokens_ = nullptr;
  size_t n_ = 0;
  int token_bytes_ = 2;
};

// Reads a whole shard into a vector (for small shards and tests).
std::vector<uint32_t> read_shard(const std::string& path);

// Splits a token stream into dir/<prefix>_000000.bin, _000001.bin, ... of at most shard_tokens
// tokens each, token_bytes (2 or 4) per token.
class ShardSetWriter {
 public:
  ShardSetWriter(std::string dir, std::string prefix, size_t shard_tokens, int token_bytes = 2);
  void add(const int32_t* tokens, size_t n);
  void add(const std::vector<int32_t>& t) { add(t.data(), t.size()); }
  // Flushes the last shard; returns the files written (at least one, possibly empty).
  std::vector<std::string> finish();
  size_t total_tokens() const { return total_; }

 private:
  void flush();
  std::string dir_, prefix_;
  size_t shard_tokens_;
  int token_bytes_;
  std::vector<int32_t> buf_;
  std::vector<std::string> files_;
  size_t total_ = 0;
};

}  // namespace atl
