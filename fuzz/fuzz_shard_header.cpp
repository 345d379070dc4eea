// Fuzz target: llm.c token shard headers (data/shards: parse_shard_header, uint16 and uint32).
// On success the header's count must match the input's size exactly, and every token is read.
#include <cstring>

#include "core/error.h"
#include "data/shards.h"
#include "fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::ShardHeader h;
  try {
    h = atl::parse_shard_header(data, size, "fuzz.bin");
  } catch (const atl::Error&) {
    return 0;
  }
  ATOLL_FUZZ_ASSERT(h.token_bytes == 2 || h.token_bytes == 4);
  ATOLL_FUZZ_ASSERT(atl::kShardHeaderBytes + h.tokens * size_t(h.token_bytes) == size);
  uint64_t sum = 0;
  for (size_t i = 0; i < h.tokens; ++i) {
    uint32_t t = 0;
    std::memcpy(&t, data + atl::kShardHeaderBytes + i * size_t(h.token_bytes), size_t(h.token_bytes));
    sum += t;
  }
  (void)sum;
  return 0;
}
