// A process-wide observer of collective progress, for the external watcher of issue 14
// (resilience/progress_record.h publishes what it sees; `atoll watch` reads it from another
// process). The communicator reports when an operation starts and ends on its worker thread and
// when a caller blocks on one in Work::wait(), so that a rank stuck in a collective can be told
// from one stuck anywhere else, and by which collective. Calls are cheap and never throw; with no
// observer installed they cost one atomic load.
#pragma once
#include <cstdint>
#include <string>

namespace atl::comm {

class CollectiveObserver {
 public:
  virtual ~CollectiveObserver() = default;
  // On the communicator's worker thread: `name` is "all_reduce #12", bytes its tensors' size.
  virtual void op_started(const std::string& name, int64_t bytes) noexcept = 0;
  virtual void op_finished(const std::string& name, bool ok) noexcept = 0;
  // A caller blocks in Work::wait() on `name` (not called when the work is already done).
  virtual void wait_begin(const std::string& name) noexcept = 0;
  virtual void wait_end() noexcept = 0;
};

// Installs (or, with nullptr, removes) the observer; the caller keeps it alive while installed.
void set_collective_observer(CollectiveObserver* o);
CollectiveObserver* collective_observer();

}  // namespace atl::comm
