// Caching allocator: freed blocks are kept in size classes and handed out again, so a training
// step that allocates the same activations every iteration touches malloc only on the first one.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace atl {

struct AllocatorStats {
  size_t current_bytes = 0;  // held by live tensors
  size_t peak_bytes = 0;     // high-water mark of current_bytes
  size_t cached_bytes = 0;   // freed but kept for reuse
  uint64_t allocations = 0;  // requests served
  uint64_t cache_hits = 0;   // requests served from the cache
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* p, size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual void release_cache() = 0;  // return cached blocks to the system
};

// The size-class cache every device's allocator is built on: freed blocks are kept by size class
// (rounded up to `granularity` below 1 MiB, to 1/8 of the power of two above) and a request is
// served from the smallest cached block no bigger than max_reuse_size (1.25x the rounded request);
// a block is never split. Only the raw allocation differs between devices, so it is all the
// Backend supplies.
class CachingAllocator final : public Allocator {
 public:
  struct Backend {
    void* (*alloc)(size_t nbytes);  // returns null when the device is out of memory
    void (*free)(void* p);
    // The cache a request draws from (the calling thread's CUDA device); null: a single cache.
    int (*pool)();
    // Called when alloc fails even after the cache was released; throws atl::Error.
    [[noreturn]] void (*out_of_memory)(size_t nbytes, int pool, size_t bytes_in_use);
    size_t granularity;  // rounding below 1 MiB, a power of two
  };
  explicit CachingAllocator(Backend b);
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t nbytes) override;
  // Never throws (runs in Storage's destructor); the block returns to the cache it came from.
  void deallocate(void* p, size_t nbytes) override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  void release_cache() override;

  size_t round_size(size_t nbytes) const;
  // The largest cached block a request of `rounded` bytes (a round_size result) may be served from.
  static size_t max_reuse_size(size_t rounded);

 private:
  struct Impl;
  Impl* impl_;
};

// The process-wide allocator for a device (the CPU one today; CUDA registers its own).
Allocator& allocator_for(Device d);
void register_allocator(Device::Kind kind, Allocator* a);

}  // namespace atl
