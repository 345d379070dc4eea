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

// The process-wide allocator for a device (the CPU one today; CUDA registers its own).
Allocator& allocator_for(Device d);
void register_allocator(Device::Kind kind, Allocator* a);

}  // namespace atl
