#include "tensor/allocator.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace atl {

struct CachingAllocator::Impl {
  Backend be;
  mutable std::mutex mu;
  std::map<int, std::multimap<size_t, void*>> free;  // per pool: size -> cached block
  struct Block {
    size_t size;
    int pool;
  };
  std::map<void*, Block> live;
  AllocatorStats st;

  void release_locked() {
    for (auto& [pool, fl] : free)
      for (auto& [sz, p] : fl) be.free(p);
    free.clear();
    st.cached_bytes = 0;
  }
};

CachingAllocator::CachingAllocator(Backend b) : impl_(new Impl{}) {
  ATOLL_CHECK(b.alloc && b.free && b.out_of_memory, "CachingAllocator: the backend needs alloc, free and out_of_memory");
  ATOLL_CHECK(b.granularity > 0 && (b.granularity & (b.granularity - 1)) == 0,
              "CachingAllocator: granularity {} is not a power of two", b.granularity);
  impl_->be = b;
}

CachingAllocator::~CachingAllocator() {
  release_cache();
  delete impl_;
}

size_t CachingAllocator::round_size(size_t n) const {
  if (n == 0) n = 1;
  const size_t g = impl_->be.granularity;
  if (n < (1u << 20)) return (n + g - 1) & ~(g - 1);
  size_t p = 1;
  while (p < n) p <<= 1;
  size_t step = p / 8;
  return (n + step - 1) / step * step;
}

// Best fit within 1.25x. The bound is what lets narrower tensors save memory: with the old 2x, by
// the second step the cache holds a block of every fp32 activation size and the half-size bf16
// copies of mixed precision land in them, so bf16 held 0.99x fp32's peak bytes at d384; within
// 1.25x it holds 0.88x (1.125x: 0.87x but a bigger cache; sweep in docs/mixed_precision.md).
size_t CachingAllocator::max_reuse_size(size_t rounded) { return rounded + rounded / 4; }

void* CachingAllocator::allocate(size_t nbytes) {
  Impl& m = *impl_;
  size_t sz = round_size(nbytes);
  const int pool = m.be.pool ? m.be.pool() : 0;  // outside the lock: it may call the runtime
  std::lock_guard<std::mutex> lk(m.mu);
  ++m.st.allocations;
  auto& fl = m.free[pool];
  auto it = fl.lower_bound(sz);
  void* p = nullptr;
  if (it != fl.end() && it->first <= max_reuse_size(sz)) {
    p = it->second;
    sz = it->first;
    m.st.cached_bytes -= sz;
    fl.erase(it);
    ++m.st.cache_hits;
  } else {
    p = m.be.alloc(sz);
    if (!p) {
      m.release_locked();  // out of memory: give the cache back and try once more
      p = m.be.alloc(sz);
    }
    if (!p) m.be.out_of_memory(sz, pool, m.st.current_bytes);
  }
  m.live[p] = {sz, pool};
  m.st.current_bytes += sz;
  if (m.st.current_bytes > m.st.peak_bytes) m.st.peak_bytes = m.st.current_bytes;
  return p;
}

void CachingAllocator::deallocate(void* p, size_t) {
  if (!p) return;
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.live.find(p);
  if (it == m.live.end()) return;
  auto [sz, pool] = it->second;
  m.live.erase(it);
  m.st.current_bytes -= sz;
  m.st.cached_bytes += sz;
  m.free[pool].emplace(sz, p);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->st;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->st.peak_bytes = impl_->st.current_bytes;
}

void CachingAllocator::release_cache() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->release_locked();
}

namespace {

// Host blocks are 64-byte aligned (one cache line, one AVX-512 vector) and rounded to 64 B.
void* host_alloc(size_t n) { return std::aligned_alloc(64, n); }
void host_free(void* p) { std::free(p); }
[[noreturn]] void host_oom(size_t n, int, size_t in_use) {
  fail("out of host memory allocating {} bytes ({} in use by tensors)", n, in_use);
}

Allocator* g_allocators[2] = {nullptr, nullptr};

}  // namespace

void register_allocator(Device::Kind kind, Allocator* a) { g_allocators[int(kind)] = a; }

Allocator& allocator_for(Device d) {
  // Deliberately never destroyed: tensors held in statics may outlive every other static.
  static CachingAllocator* cpu = new CachingAllocator({host_alloc, host_free, nullptr, host_oom, 64});
  if (d.is_cpu()) return g_allocators[0] ? *g_allocators[0] : *cpu;
  ATOLL_CHECK(g_allocators[int(d.kind)] != nullptr, "no allocator registered for device {}", d.str());
  return *g_allocators[int(d.kind)];
}

}  // namespace atl
