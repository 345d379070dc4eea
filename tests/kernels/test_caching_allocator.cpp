// The caching-allocator core (tensor/allocator.h) that the CPU allocator and the CUDA one
// (kernels/cuda/device.cpp) are both built on, driven through a fake device so that the CUDA
// behaviour (one cache per device, release-and-retry on out-of-memory, the error) is checked on
// machines without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "core/error.h"
#include "tensor/allocator.h"

using namespace atl;

namespace {

struct Fake {
  static inline int pool = 0;
  static inline int fails = 0;  // how many of the next raw allocations fail
  static inline int raw_allocs = 0, raw_frees = 0;
  static inline std::set<void*> held;
  static void* alloc(size_t n) {
    if (fails > 0) {
      --fails;
      return nullptr;
    }
    ++raw_allocs;
    void* p = std::malloc(n);
    held.insert(p);
    return p;
  }
  static void free(void* p) {
    ++raw_frees;
    held.erase(p);
    std::free(p);
  }
  static int current() { return pool; }
  [[noreturn]] static void oom(size_t n, int pool, size_t in_use) {
    fail("fake device {} out of memory for {} bytes with {} in use", pool, n, in_use);
  }
};

CachingAllocator make() {
  Fake::pool = Fake::fails = Fake::raw_allocs = Fake::raw_frees = 0;
  return CachingAllocator({Fake::alloc, Fake::free, Fake::current, Fake::oom, 512});
}

}  // namespace

TEST(CachingAllocatorCore, RoundsToSizeClasses) {
  CachingAllocator a = make();
  EXPECT_EQ(a.round_size(1), 512u);
  EXPECT_EQ(a.round_size(513), 1024u);
  EXPECT_EQ(a.round_size((1u << 20) + 1), (1u << 20) + (1u << 18));  // 1/8 of 2 MiB steps above 1 MiB
}

TEST(CachingAllocatorCore, ReusesOnlyWithinAQuarterAboveTheRequestAndCounts) {
  CachingAllocator a = make();
  EXPECT_EQ(CachingAllocator::max_reuse_size(a.round_size(100000)), 100352u + 100352u / 4);
  void* p = a.allocate(100000);  // 100352 once rounded
  a.deallocate(p, 100000);
  EXPECT_EQ(a.allocate(85000), p);  // rounds to 85504; 100352 is within 1.25x of that
  void* q = a.allocate(100000);     // nothing cached now: a new block
  EXPECT_NE(q, p);
  EXPECT_EQ(Fake::raw_allocs, 2);
  a.deallocate(q, 100000);
  // A half-size request (a bf16 copy of an fp32 tensor whose block is cached) gets its own block:
  // the 2x rule this replaces served it from the full-size one, so bf16 saved nothing.
  void* h = a.allocate(50000);
  EXPECT_NE(h, q);
  EXPECT_EQ(Fake::raw_allocs, 3);
  const AllocatorStats s = a.stats();
  EXPECT_EQ(s.allocations, 4u);
  EXPECT_EQ(s.cache_hits, 1u);
  EXPECT_EQ(s.cached_bytes, a.round_size(100000));
  EXPECT_EQ(s.current_bytes, 100352u + a.round_size(50000))
      << "a hit is charged the cached block's size, not the request's";
  a.deallocate(p, 85000);
  a.deallocate(h, 50000);
}

TEST(CachingAllocatorCore, ServesTheSmallestFittingBlockAboveOneMiB) {
  CachingAllocator a = make();
  const size_t mib = size_t(1) << 20;
  void* big = a.allocate(8 * mib);
  void* fit = a.allocate(5 * mib);
  void* tight = a.allocate(4 * mib);
  a.deallocate(big, 8 * mib);
  a.deallocate(fit, 5 * mib);
  a.deallocate(tight, 4 * mib);
  EXPECT_EQ(a.allocate(4 * mib), tight);  // the smallest that fits, though 5 MiB also would
  EXPECT_EQ(a.allocate(4 * mib), fit);    // 5 MiB is exactly 1.25x: still served
  void* fresh = a.allocate(4 * mib);      // 8 MiB is 2x: a new block, the big one stays cached
  EXPECT_NE(fresh, big);
  EXPECT_EQ(Fake::raw_allocs, 4);
  EXPECT_EQ(a.stats().cached_bytes, 8 * mib);
  for (void* b : {tight, fit, fresh}) a.deallocate(b, 4 * mib);
}

TEST(CachingAllocatorCore, KeepsOneCachePerDevice) {
  CachingAllocator a = make();
  Fake::pool = 0;
  void* p = a.allocate(4096);
  a.deallocate(p, 4096);
  Fake::pool = 1;
  void* q = a.allocate(4096);
  EXPECT_NE(q, p);  // device 0's block is not handed to device 1
  a.deallocate(q, 4096);
  Fake::pool = 0;
  EXPECT_EQ(a.allocate(4096), p);
}

TEST(CachingAllocatorCore, OutOfMemoryReleasesTheCacheRetriesThenFails) {
  CachingAllocator a = make();
  void* p = a.allocate(8192);
  a.deallocate(p, 8192);
  Fake::fails = 1;  // the first try fails, the retry after releasing the cache succeeds
  void* q = a.allocate(1 << 20);
  EXPECT_NE(q, nullptr);
  EXPECT_EQ(Fake::raw_frees, 1);
  EXPECT_EQ(a.stats().cached_bytes, 0u);
  Fake::fails = 2;
  try {
    a.allocate(1 << 21);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("fake device 0 out of memory"), std::string::npos) << m;
    EXPECT_NE(m.find(std::to_string(a.round_size(1 << 20))), std::string::npos) << m;  // bytes in use
  }
  a.deallocate(q, 1 << 20);
}
