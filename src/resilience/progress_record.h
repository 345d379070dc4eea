// The progress record a rank publishes for the external watcher (issue 14 item 6; `atoll watch`,
// resilience/watcher.h): a 4 KB file per rank, memory-mapped and shared, that the rank updates
// with plain stores and the watcher reads from another process — also while the rank is stopped,
// hung or dead, which is the point. It holds the step, the phase (compute, a wait in a collective,
// data, checkpoint, eval, idle, done) with the time spent in each so far, a counter of progress
// events, and the collectives started, finished and waited on (comm/collective_observer.h feeds
// those). Updates take a process-local mutex and bump a sequence number around the write (a
// seqlock), so that the reader sees a consistent record without blocking the writer.
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace atl::resilience {

enum class Phase : int { startup = 0, compute, collective, data, checkpoint, eval, idle, done };
constexpr int kPhases = 8;
const char* phase_name(Phase p);

// One read of a record (ProgressPublisher's fields, consistent with each other).
struct ProgressSample {
  int pid = 0, rank = -1, world = 0;
  int64_t step = 0;
  Phase phase = Phase::startup;      // the effective one: collective while any thread waits on one
  Phase base_phase = Phase::startup;  // what the trainer said it is doing
  int64_t events = 0;                 // progress: steps, phase changes, finished collectives
  int64_t last_event_ns = 0;          // steady clock (CLOCK_MONOTONIC: one clock for every process)
  std::array<int64_t, kPhases> phase_ns{};  // time in each phase up to `now_ns`
  int64_t ops_started = 0, ops_finished = 0, ops_failed = 0, bytes = 0;
  int inflight = 0, waiting = 0;
  std::string last_op;  // the last collective a worker started ("all_reduce #12")
  std::string wait_op;  // the one a caller waits on now (or last waited on)
  int64_t now_ns = 0;   // when this sample was taken
  bool in_collective() const { return waiting > 0 || inflight > 0; }
};

std::optional<ProgressSample> read_progress(const std::string& path);
int64_t monotonic_ns();

// The process's publisher (one per process: the communicator's observer is process-wide).
class ProgressPublisher {
 public:
  static ProgressPublisher& instance();
  // Creates (or replaces) the record at `path` and installs the collective observer.
  void open(const std::string& path, int rank, int world);
  // Marks the record done (a normal end) or leaves it as is, detaches and unmaps it.
  void close(bool finished);
  bool active() const;
  void set_step(int64_t step);
  void set_phase(Phase p);  // the trainer's phase (not collective: that comes from the observer)
  Phase phase() const;

 private:
  ProgressPublisher() = default;
  struct Impl;
  Impl* impl_ = nullptr;
};

// Sets the publisher's phase for a scope and restores the previous one (nothing when no record).
class PhaseScope {
 public:
  explicit PhaseScope(Phase p);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase prev_;
  bool on_;
};

}  // namespace atl::resilience
