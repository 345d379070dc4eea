#include "parallel/page_release.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace atl::parallel {

void release_range(float* data, int64_t lo, int64_t hi) {
  if (hi <= lo) return;
  auto* begin = reinterpret_cast<char*>(data + lo);
  auto* end = reinterpret_cast<char*>(data + hi);
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  auto* pb = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page);
  auto* pe = reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(end) / page * page);
  if (pe <= pb) {
    std::memset(begin, 0, size_t(end - begin));
    return;
  }
  std::memset(begin, 0, size_t(pb - begin));
  std::memset(pe, 0, size_t(end - pe));
  // Anonymous private memory: the released pages come back zero-filled on the next touch.
  if (madvise(pb, size_t(pe - pb), MADV_DONTNEED) != 0) std::memset(pb, 0, size_t(pe - pb));
}

namespace {
int64_t status_kb(const char* key) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  int64_t kb = 0;
  size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f))
    if (!std::strncmp(line, key, n)) {
      kb = std::atoll(line + n);
      break;
    }
  std::fclose(f);
  return kb;
}
}  // namespace

int64_t resident_bytes() { return status_kb("VmRSS:") * 1024; }
int64_t peak_resident_bytes() { return status_kb("VmHWM:") * 1024; }

}  // namespace atl::parallel
