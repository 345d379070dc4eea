// Optimizer state kept in a memory-mapped file instead of the process's resident memory, with the
// optimizer step streamed over it (after ZeRO-Offload, Ren et al. 2021, and ZeRO-Infinity,
// Rajbhandari et al. 2021, which page optimizer state to host memory and NVMe; on a CPU trainer the
// "device" is this process's resident set, so the offload target is a file). The step visits the
// state in chunks and hands each chunk's pages back as soon as it is updated (madvise DONTNEED on
// a shared file mapping: the kernel writes them to the file, the process no longer holds them), so
// at most one chunk of the state is resident at a time. The file is unlinked at once: it lives
// exactly as long as the mapping. train.memory_budget_gb chooses it (train/memory_budget.h).
#pragma once
#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace atl {

class StateFile {
 public:
  // floats of zero-filled state in a new file under dir.
  StateFile(const std::string& dir, int64_t floats);
  ~StateFile();
  StateFile(const StateFile&) = delete;
  StateFile& operator=(const StateFile&) = delete;
  float* data() const { return base_; }
  int64_t floats() const { return floats_; }
  // The pages lying wholly inside [lo, hi) (floats) leave the resident set (their contents stay).
  void release(int64_t lo, int64_t hi) const;
  void release_all() const { release(0, floats_); }
  Tensor view(int64_t offset, const Shape& shape) const;

 private:
  float* base_ = nullptr;
  int64_t floats_ = 0;
  size_t bytes_ = 0;
};

// Bytes of the mapping that starts at p that are resident in this process (/proc/self/smaps'
// Rss); -1 when no mapping starts there.
int64_t mapping_resident_bytes(const void* p);
// This process's peak resident set (VmHWM), bytes; -1 when unknown.
int64_t peak_rss_bytes();
// Restarts the peak from the current resident set (/proc/self/clear_refs, Linux 4.0+); false
// when the kernel does not allow it.
bool reset_peak_rss();

}  // namespace atl
