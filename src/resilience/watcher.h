// The external watcher (issue 14 item 6; seed: the B300 field report, which tells a node's phases
// apart by board power). On CPUs the telemetry is each rank's per-thread CPU time
// (/proc/<pid>/task/*/stat) and the progress record the rank publishes (progress_record.h: step,
// phase, time per phase, collectives started, finished and waited on). From them, over a sliding
// window, each rank is one of
//
//   compute-bound, communication-bound, data starvation, checkpoint, eval   (making progress: the
//       phase that took most of the window)
//   deadlock   no progress event for hang_s, no CPU (< 5% of a core), inside a collective
//   idle       no progress for hang_s, no CPU, outside any collective (a stuck loader, a lock)
//   stopped    the process is stopped (SIGSTOP, a debugger) — state T in /proc
//   dead       the process is gone without finishing; finished: gone after a normal end
//
// and judge() turns a silent hang into a named failure (no live rank progressed for hang_s and one
// is stopped or deadlocked; or a rank died, unless the job is fault tolerant): which rank is the cause (stopped, dead,
// idle outside a collective, finished while the others wait, or in another collective than the
// rest), which phase and which collective each rank is in, and for how long.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "resilience/progress_record.h"

namespace atl::resilience {

enum class RankState {
  starting, compute_bound, communication_bound, data_starvation, checkpoint, eval, idle,
  deadlock, stopped, dead, finished
};
const char* rank_state_name(RankState s);

struct WatchOptions {
  double window_s = 2.0;  // the phase shares and the CPU rate are over this window
  double hang_s = 10.0;   // no progress event for this long (and no CPU) is a hang
  double idle_cpu = 0.05; // below this fraction of one core a rank uses "no CPU"
  // A fault-tolerant job (quorum replicas, `atoll launch --ft`) goes on without a dead or stopped
  // replica: then only a job where no live rank progresses is a failure.
  bool tolerant = false;
  // Records whose last progress event is older than this (CLOCK_MONOTONIC ns) are left out: those
  // of an earlier start of the job, before its ranks replace them (`atoll launch --max-restarts`).
  int64_t ignore_before_ns = 0;
};

// What /proc says about a process: state letter ('R', 'S', 'D', 'T', 'Z'; 0 when gone), CPU time
// of all its threads in seconds, and the busiest thread's.
struct ProcSample {
  char state = 0;
  double cpu_s = 0, top_thread_cpu_s = 0;
  int threads = 0;
};
ProcSample sample_process(int pid);

struct RankView {
  int rank = -1, pid = 0;
  RankState state = RankState::starting;
  int64_t step = 0;
  Phase phase = Phase::startup;
  std::string op;        // the collective waited on (or the last one started)
  double cpu = 0;        // cores used over the window
  double stalled_s = 0;  // since the last progress event
  std::array<double, kPhases> share{};  // of the window's time, per phase
  bool in_collective = false;
  std::string describe() const;  // "rank 1 (pid 42) step 7: deadlock in all_reduce #15 ..."
};

struct Verdict {
  bool failure = false;
  std::vector<int> culprits;  // the ranks named as the cause
  std::string message;        // empty when there is nothing to say
};

// Judges a set of views (pure: the tests feed it hand-made ones too).
Verdict judge(const std::vector<RankView>& views, const WatchOptions& o);

class Watcher {
 public:
  // `dir` holds the records (rank<R>.progress, as the trainer writes them).
  Watcher(std::string dir, WatchOptions o);
  // Reads every record and its process now, classifies each rank; ordered by rank.
  std::vector<RankView> sample();

 private:
  struct Point {
    int64_t t_ns;
    double cpu_s;
    std::array<int64_t, kPhases> phase_ns;
  };
  std::string dir_;
  WatchOptions o_;
  std::map<std::string, std::deque<Point>> history_;  // per record file
};

// The record path of `rank` under `dir`.
std::string progress_path(const std::string& dir, int rank);

}  // namespace atl::resilience
