// Giving memory back while keeping the address: ZeRO-3 keeps every parameter as a view into the
// model's one flat buffer, so instead of freeing a gathered block it zeroes it and returns the
// whole pages inside it to the kernel (madvise MADV_DONTNEED); they read as zeros and cost no
// resident memory until written again.
#pragma once
#include <cstdint>

namespace atl::parallel {

// Zeroes data[lo, hi) and releases the pages that lie wholly inside it.
void release_range(float* data, int64_t lo, int64_t hi);
// Resident set size of this process now and its peak (VmHWM), in bytes, from /proc/self/status.
int64_t resident_bytes();
int64_t peak_resident_bytes();

}  // namespace atl::parallel
