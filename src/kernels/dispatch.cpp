#include "kernels/dispatch.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>

#include "core/error.h"

namespace atl::cpu {
void register_kernel_tables();  // kernels/cpu/table_f32.cpp
}

namespace atl::kernels {
namespace {

constexpr int kKinds = 2, kDTypes = 4;

struct Registry {
  std::mutex mu;
  std::atomic<const KernelTable*> tables[kKinds][kDTypes] = {};  // read without the lock
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: ops may run during static teardown
  return *r;
}

}  // namespace

void register_table(Device::Kind kind, DType dt, const KernelTable* t) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.tables[int(kind)][int(dt)].store(t);
}

const KernelTable& table(Device dev, DType dt) {
  // The CPU tables are registered on first lookup rather than by a static initialiser: an object
  // file that only registers would be dropped by the linker from a static library, and naming it
  // here also fixes the order (no lookup can run before them).
  static const bool builtin = (cpu::register_kernel_tables(), true);
  (void)builtin;
  const KernelTable* t = registry().tables[int(dev.kind)][int(dt)].load(std::memory_order_acquire);
  if (t) return *t;
  std::string have;
  Registry& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  for (int k = 0; k < kKinds; ++k)
    for (int d = 0; d < kDTypes; ++d)
      if (const KernelTable* h = r.tables[k][d].load()) have += std::string(have.empty() ? "" : ", ") + h->name;
  fail("no kernels for device {} with dtype {} (kernel tables registered: {})", dev.str(), dtype_name(dt), have);
}

bool broadcast_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b, std::vector<int64_t>* out,
                      Broadcast* plan) {
  const size_t r = std::max(a.size(), b.size());
  std::vector<int64_t> pa(r, 1), pb(r, 1), po(r, 1);
  std::copy(a.begin(), a.end(), pa.begin() + int64_t(r - a.size()));
  std::copy(b.begin(), b.end(), pb.begin() + int64_t(r - b.size()));
  for (size_t d = 0; d < r; ++d) {
    if (pa[d] != pb[d] && pa[d] != 1 && pb[d] != 1) return false;
    po[d] = pa[d] == 1 ? pb[d] : pa[d];
  }
  *out = po;
  // Merge runs of dims with the same pattern (a full or broadcast, b full or broadcast).
  Broadcast bc;
  bool fa[kMaxBroadcastDims], fb[kMaxBroadcastDims];
  int n = 0;
  for (size_t d = 0; d < r; ++d) {
    if (po[d] == 1) continue;
    const bool ia = pa[d] != 1, ib = pb[d] != 1;
    if (n > 0 && fa[n - 1] == ia && fb[n - 1] == ib) {
      bc.size[n - 1] *= po[d];
      continue;
    }
    if (n == kMaxBroadcastDims) return false;
    fa[n] = ia;
    fb[n] = ib;
    bc.size[n++] = po[d];
  }
  if (n == 0) {  // every dim is 1: one element
    fa[0] = fb[0] = true;
    bc.size[n++] = 1;
  }
  bc.ndim = n;
  int64_t acc_a = 1, acc_b = 1;
  for (int d = n - 1; d >= 0; --d) {
    bc.sa[d] = fa[d] ? acc_a : 0;
    bc.sb[d] = fb[d] ? acc_b : 0;
    if (fa[d]) acc_a *= bc.size[d];
    if (fb[d]) acc_b *= bc.size[d];
    bc.numel *= bc.size[d];
  }
  *plan = bc;
  return true;
}

}  // namespace atl::kernels
