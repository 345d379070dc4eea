// The step-scoped cache of bf16 weight copies (weight_cast_cache.h). One training thread records
// a step's graph, so the cache is per thread, like the tape.
#include "autograd/weight_cast_cache.h"

#include <atomic>
#include <unordered_map>

#include "autograd/graph.h"
#include "kernels/cpu/gemm.h"

namespace atl {
namespace {

struct Entry {
  std::weak_ptr<Storage> storage;  // the weight's storage: an expired one can never match
  int64_t offset = 0;
  Shape shape;
  Tensor copy;
};

struct Cache {
  int depth = 0;  // nested scopes share the outermost one's version
  std::unordered_map<const void*, Entry> entries;  // by the weight's first element
  WeightCastStats stats;
};
thread_local Cache g_cache;
std::atomic<uint64_t> g_version{1};  // shared by all threads: a new version anywhere invalidates everywhere

Tensor convert(const Tensor& w) {
  Tensor b = Tensor::empty(w.shape(), DType::bf16);
  cpu::f32_to_bf16(w.f32(), b.data<bf16>(), w.numel());
  ++g_cache.stats.conversions;
  return b;
}

void clear() {
  g_cache.entries.clear();
  g_cache.stats.cached_bytes = 0;
  ++g_version;
}

}  // namespace

WeightCastScope::WeightCastScope() {
  if (g_cache.depth++ == 0) clear();
}
WeightCastScope::~WeightCastScope() {
  if (--g_cache.depth == 0) clear();
}

void invalidate_weight_casts() { clear(); }
uint64_t weights_version() { return g_version.load(); }
WeightCastStats weight_cast_stats() { return g_cache.stats; }

Tensor bf16_weight(const Tensor& w) {
  ATOLL_CHECK(w.dtype() == DType::f32, "bf16_weight: needs an f32 weight, got {} {}", dtype_name(w.dtype()),
              shape_str(w.shape()));
  if (!w.is_contiguous()) return convert(w.contiguous());
  const bool leaf = w.autograd() && w.autograd()->is_leaf && w.autograd()->requires_grad;
  if (g_cache.depth == 0 || !leaf) return convert(w);
  Entry& e = g_cache.entries[w.raw()];
  if (e.copy.defined() && e.storage.lock() == w.storage() && e.offset == w.offset() && e.shape == w.shape()) {
    ++g_cache.stats.reuses;
    return e.copy;
  }
  if (e.copy.defined()) g_cache.stats.cached_bytes -= int64_t(e.copy.nbytes());
  e = Entry{w.storage(), w.offset(), w.shape(), convert(w)};
  g_cache.stats.cached_bytes += int64_t(e.copy.nbytes());
  return e.copy;
}

}  // namespace atl
