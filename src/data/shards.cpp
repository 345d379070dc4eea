// llm.c token shards (Karpathy, llm.c: dev/data/data_common.py write_datafile, llmc/dataloader.h):
// writer, memory-mapped reader with header validation, and a writer that splits a stream into
// fixed-size shards.
#include "data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace atl {

namespace fs = std::filesystem;

void write_shard(const std::string& path, const int32_t* tokens, size_t n) {
  ATOLL_CHECK(n < (size_t(1) << 31), "shard {}: {} tokens exceed the format's int32 count", path,
              n);
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) {
    ATOLL_CHECK(tokens[i] >= 0 && tokens[i] < 65536,
                "shard {}: token id {} does not fit the uint16 shard format; the tokenizer's "
                "vocabulary must have fewer than 65536 ids",
                path, tokens[i]);
    t[i] = uint16_t(tokens[i]);
  }
  int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = int32_t(n);
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    ATOLL_CHECK(out.good(), "cannot create {}: {}", tmp, std::strerror(errno));
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    out.write(reinterpret_cast<const char*>(t.data()), std::streamsize(n * sizeof(uint16_t)));
    out.close();
    ATOLL_CHECK(out.good(), "cannot write {} (disk full?)", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  ATOLL_CHECK(!ec, "cannot rename {} to {}: {}", tmp, path, ec.message());
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  ATOLL_CHECK(fd >= 0, "cannot open token shard {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("cannot stat {}: {}", path, std::strerror(errno));
  }
  size_t bytes = size_t(st.st_size);
  if (bytes < kShardHeaderBytes) {
    ::close(fd);
    fail("{} is not a token shard: {} bytes is shorter than the {}-byte header", path, bytes,
         kShardHeaderBytes);
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ATOLL_CHECK(m != MAP_FAILED, "cannot map {}: {}", path, std::strerror(errno));
  map_ = m;
  map_bytes_ = bytes;
  const int32_t* h = static_cast<const int32_t*>(m);
  auto bad = [&](const std::string& why) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    fail("{} is not a valid token shard: {}; regenerate it with `atoll data prepare`", path, why);
  };
  if (h[0] != kShardMagic)
    bad(fmt::format("magic number {} (expected {}{})", h[0], kShardMagic,
                    h[0] == 20240326 ? "; this looks like an llm.c model checkpoint" : ""));
  if (h[1] != kShardVersion)
    bad(
        fmt::format("version {} (expected {}; version 2 shards hold uint32 tokens, which atoll "
                    "does not read)",
                    h[1], kShardVersion));
  if (h[2] < 0) bad(fmt::format("negative token count {}", h[2]));
  size_t expect = kShardHeaderBytes + size_t(h[2]) * sizeof(uint16_t);
  if (bytes != expect)
    bad(fmt::format("the header promises {} tokens ({} bytes) but the file has {} bytes{}", h[2],
                    expect, bytes, bytes < expect ? " (truncated?)" : ""));
  n_ = size_t(h[2]);
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(m) + kShardHeaderBytes);
}

ShardReader::~ShardReader() {
  if (map_) ::munmap(map_, map_bytes_);
}

ShardReader::ShardReader(ShardReader&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      map_bytes_(o.map_bytes_),
      tokens_(o.tokens_),
      n_(o.n_) {
  o.map_ = nullptr;
  o.tokens_ = nullptr;
  o.n_ = 0;
}

uint16_t ShardReader::max_token() const {
  uint16_t m = 0;
  for (size_t i = 0; i < n_; ++i) m = std::max(m, tokens_[i]);
  return m;
}

std::vector<uint16_t> read_shard(const std::string& path) {
  ShardReader r(path);
  return std::vector<uint16_t>(r.data(), r.data() + r.size());
}

ShardSetWriter::ShardSetWriter(std::string dir, std::string prefix, size_t shard_tokens)
    : dir_(std::move(dir)), prefix_(std::move(prefix)), shard_tokens_(shard_tokens) {
  ATOLL_CHECK(shard_tokens_ >= 1 && shard_tokens_ < (size_t(1) << 31),
              "shard size {} tokens must be in [1, 2^31)", shard_tokens_);
}

void ShardSetWriter::add(const int32_t* tokens, size_t n) {
  total_ += n;
  while (n > 0) {
    size_t take = std::min(n, shard_tokens_ - buf_.size());
    buf_.insert(buf_.end(), tokens, tokens + take);
    tokens += take;
    n -= take;
    if (buf_.size() == shard_tokens_) flush();
  }
}

void ShardSetWriter::flush() {
  std::string path =
      (fs::path(dir_) / fmt::format("{}_{:06d}.bin", prefix_, files_.size())).string();
  write_shard(path, buf_);
  files_.push_back(path);
  buf_.clear();
}

std::vector<std::string> ShardSetWriter::finish() {
  if (!buf_.empty() || files_.empty()) flush();
  return files_;
}

}  // namespace atl
