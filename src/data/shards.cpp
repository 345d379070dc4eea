// llm.c token shards (Karpathy, llm.c: dev/data/data_common.py write_datafile, llmc/dataloader.h),
// uint16 and uint32: writer, memory-mapped reader with header validation, and a writer that splits a stream into
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

int shard_token_bytes(int64_t vocab_size) {
  ATOLL_CHECK(vocab_size > 0 && vocab_size <= (int64_t(1) << 31),
              "vocab size {} is outside the token shards' range [1, 2^31]", vocab_size);
  return vocab_size <= 65536 ? 2 : 4;
}

void write_shard(const std::string& path, const int32_t* tokens, size_t n, int token_bytes) {
  ATOLL_CHECK(token_bytes == 2 || token_bytes == 4, "shard {}: {} bytes per token (2 or 4)", path,
              token_bytes);
  ATOLL_CHECK(n < (size_t(1) << 31), "shard {}: {} tokens exceed the format's int32 count", path,
              n);
  std::vector<char> t(n * size_t(token_bytes));
  for (size_t i = 0; i < n; ++i) {
    ATOLL_CHECK(tokens[i] >= 0 && (token_bytes == 4 || tokens[i] < 65536),
                "shard {}: token id {} does not fit the {} shard format{}", path, tokens[i],
                token_bytes == 2 ? "uint16" : "uint32",
                token_bytes == 2 ? "; a vocabulary of more than 65536 ids needs uint32 shards" : "");
    if (token_bytes == 2) {
      uint16_t v = uint16_t(tokens[i]);
      std::memcpy(t.data() + 2 * i, &v, 2);
    } else {
      uint32_t v = uint32_t(tokens[i]);
      std::memcpy(t.data() + 4 * i, &v, 4);
    }
  }
  int32_t header[kShardHeaderInts] = {};
  header[0] = token_bytes == 2 ? kShardMagic : kShardMagicU32;
  header[1] = token_bytes == 2 ? kShardVersion : kShardVersionU32;
  header[2] = int32_t(n);
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    ATOLL_CHECK(out.good(), "cannot create {}: {}", tmp, std::strerror(errno));
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    out.write(t.data(), std::streamsize(t.size()));
    out.close();
    ATOLL_CHECK(out.good(), "cannot write {} (disk full?)", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  ATOLL_CHECK(!ec, "cannot rename {} to {}: {}", tmp, path, ec.message());
}

ShardHeader parse_shard_header(const void* bytes, size_t size, const std::string& path) {
  auto bad = [&](const std::string& why) {
    fail("{} is not a valid token shard: {}; regenerate it with `atoll data prepare`", path, why);
  };
  if (size < kShardHeaderBytes)
    fail("{} is not a token shard: {} bytes is shorter than the {}-byte header", path, size,
         kShardHeaderBytes);
  int32_t h[3];
  std::memcpy(h, bytes, sizeof(h));  // the caller's buffer need not be aligned
  ShardHeader r;
  if (h[0] == kShardMagic) {
    r.token_bytes = 2;
    if (h[1] != kShardVersion)
      bad(fmt::format("version {} (expected {} for magic {}, uint16 tokens)", h[1], kShardVersion,
                      kShardMagic));
  } else if (h[0] == kShardMagicU32) {
    r.token_bytes = 4;
    if (h[1] != kShardVersionU32)
      bad(fmt::format("version {} (expected {} for magic {}, uint32 tokens)", h[1],
                      kShardVersionU32, kShardMagicU32));
  } else {
    bad(fmt::format("magic number {} (expected {} or {}{})", h[0], kShardMagic, kShardMagicU32,
                    h[0] == 20240326 ? "; this looks like an llm.c model checkpoint" : ""));
  }
  if (h[2] < 0) bad(fmt::format("negative token count {}", h[2]));
  size_t expect = kShardHeaderBytes + size_t(h[2]) * size_t(r.token_bytes);
  if (size != expect)
    bad(fmt::format("the header promises {} tokens ({} bytes) but the file has {} bytes{}", h[2],
                    expect, size, size < expect ? " (truncated?)" : ""));
  r.tokens = size_t(h[2]);
  return r;
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  ATOLL_CHECK(fd >= 0, "cannot open token shard {}: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail("cannot stat {}: {}", path, std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("token shard {} is not a regular file", path);
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
  ShardHeader h;
  try {
    h = parse_shard_header(m, bytes, path);
  } catch (...) {
    ::munmap(m, bytes);
    throw;
  }
  map_ = m;
  map_bytes_ = bytes;
  n_ = h.tokens;
  token_bytes_ = h.token_bytes;
  tokens_ = static_cast<const char*>(m) + kShardHeaderBytes;
}

void ShardReader::read(size_t first, size_t n, int32_t* out) const {
  if (token_bytes_ == 2) {
    const uint16_t* t = static_cast<const uint16_t*>(tokens_) + first;
    for (size_t i = 0; i < n; ++i) out[i] = int32_t(t[i]);
  } else {
    // Ids >= 2^31 wrap negative here; validate_vocab and the loader's check refuse them.
    const uint32_t* t = static_cast<const uint32_t*>(tokens_) + first;
    for (size_t i = 0; i < n; ++i) out[i] = int32_t(t[i]);
  }
}

ShardReader::~ShardReader() {
  if (map_) ::munmap(map_, map_bytes_);
}

ShardReader::ShardReader(ShardReader&& o) noexcept
    : path_(std::move(o.path_)),
      map_(o.map_),
      map_bytes_(o.map_bytes_),
      tokens_(o.tokens_),
      n_(o.n_),
      token_bytes_(o.token_bytes_) {
  o.map_ = nullptr;
  o.tokens_ = nullptr;
  o.n_ = 0;
}

uint32_t ShardReader::max_token() const {
  uint32_t m = 0;
  for (size_t i = 0; i < n_; ++i) m = std::max(m, (*this)[i]);
  return m;
}

std::vector<uint32_t> read_shard(const std::string& path) {
  ShardReader r(path);
  std::vector<uint32_t> v(r.size());
  for (size_t i = 0; i < r.size(); ++i) v[i] = r[i];
  return v;
}

ShardSetWriter::ShardSetWriter(std::string dir, std::string prefix, size_t shard_tokens,
                               int token_bytes)
    : dir_(std::move(dir)),
      prefix_(std::move(prefix)),
      shard_tokens_(shard_tokens),
      token_bytes_(token_bytes) {
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
  write_shard(path, buf_, token_bytes_);
  files_.push_back(path);
  buf_.clear();
}

std::vector<std::string> ShardSetWriter::finish() {
  if (!buf_.empty() || files_.empty()) flush();
  return files_;
}

}  // namespace atl
