// Signals during training. SIGTERM and SIGINT (a scheduler's preemption, Ctrl-C, `atoll launch`
// tearing the job down) ask the loop to stop at the end of the current step, write a final
// checkpoint and return; a second SIGINT ends the process at once (a repeated SIGTERM is the same
// request again). SIGPIPE is ignored: when
// whoever reads our output goes away (`atoll train ... | head`), printing fails with EPIPE and
// training goes on, rather than the kernel ending the process silently with status 141.
#pragma once

namespace atl {

// Installs the handlers (idempotent); the previous dispositions come back when the guard dies.
class StopSignalGuard {
 public:
  StopSignalGuard();
  ~StopSignalGuard();
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;
};

// Makes one thread of its own the only one of this process's later threads that takes SIGTERM and
// SIGINT: called first in `atoll train`, before any thread starts, it blocks both in the caller
// (every thread created afterwards inherits the mask) and starts a thread that leaves them
// unblocked and sleeps. Why: a handler's frame is pushed on the receiving thread's current stack,
// and oneDNN's AVX2 JIT GEMM (libdnnl 2.6) runs with its stack pointer moved into a heap buffer, so
// a SIGTERM landing on a thread inside it overwrote the heap (glibc: "corrupted size vs. prev_size";
// the rank died without its checkpoint when `atoll launch` was killed). A mask survives fork and
// exec, so a child forked from such a thread clears it before exec (rl/sandbox.cpp). Idempotent.
void route_stop_signals();

// The signal that asked to stop (SIGTERM, SIGINT), or 0.
int stop_requested();
// Forgets a request (tests).
void clear_stop_request();

}  // namespace atl
