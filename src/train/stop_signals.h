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

// The signal that asked to stop (SIGTERM, SIGINT), or 0.
int stop_requested();
// Forgets a request (tests).
void clear_stop_request();

}  // namespace atl
