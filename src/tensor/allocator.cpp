#include "tensor/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace atl {
namespace {

// Size classes: round up to 64 B below 1 MiB, to 1/8 of the power of two above. A request is
// served from the smallest cached class that fits within 2x, so a big block is not split.
size_t round_size(size_t n) {
  if (n == 0) n = 1;
  if (n < (1u << 20)) return (n + 63) & ~size_t(63);
  size_t p = 1;
  while (p < n) p <<= 1;
  size_t step = p / 8;
  return (n + step - 1) / step * step;
}

class CpuCachingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    size_t sz = round_size(nbytes);
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.allocations;
    auto it = free_.lower_bound(sz);
    void* p = nullptr;
    if (it != free_.end() && it->first <= 2 * sz) {
      p = it->second;
      sz = it->first;
      st_.cached_bytes -= sz;
      free_.erase(it);
      ++st_.cache_hits;
    } else {
      p = std::aligned_alloc(64, sz);
      if (!p) {
        release_locked();
        p = std::aligned_alloc(64, sz);
      }
      ATOLL_CHECK(p != nullptr, "out of host memory allocating {} bytes", sz);
    }
    sizes_[p] = sz;
    st_.current_bytes += sz;
    if (st_.current_bytes > st_.peak_bytes) st_.peak_bytes = st_.current_bytes;
    return p;
  }
  void deallocate(void* p, size_t) override {
    if (!p) return;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    size_t sz = it->second;
    sizes_.erase(it);
    st_.current_bytes -= sz;
    st_.cached_bytes += sz;
    free_.emplace(sz, p);
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return st_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lk(mu_);
    st_.peak_bytes = st_.current_bytes;
  }
  void release_cache() override {
    std::lock_guard<std::mutex> lk(mu_);
    release_locked();
  }

 private:
  void release_locked() {
    for (auto& [sz, p] : free_) std::free(p);
    free_.clear();
    st_.cached_bytes = 0;
  }
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;
  std::map<void*, size_t> sizes_;
  AllocatorStats st_;
};

Allocator* g_allocators[2] = {nullptr, nullptr};

}  // namespace

void register_allocator(Device::Kind kind, Allocator* a) { g_allocators[int(kind)] = a; }

Allocator& allocator_for(Device d) {
  // Deliberately never destroyed: tensors held in statics may outlive every other static.
  static CpuCachingAllocator* cpu = new CpuCachingAllocator();
  if (d.is_cpu()) return g_allocators[0] ? *g_allocators[0] : *cpu;
  ATOLL_CHECK(g_allocators[int(d.kind)] != nullptr, "no allocator registered for device {}", d.str());
  return *g_allocators[int(d.kind)];
}

}  // namespace atl
