// A rank started by `atoll launch` dies with it. The launcher asks the kernel for a parent-death
// signal (SIGTERM) in every rank; this watchdog covers what that cannot: a launcher on another
// node (its store stops answering) and a rank that does not act on SIGTERM. When the launcher is
// gone it says so on stderr, sends this process SIGTERM when the parent-death signal cannot have
// (a launcher on another node; the trainer stops at the step's end and writes its checkpoint), and
// ends the process itself if it is still there after a grace period.
#pragma once

namespace atl::comm {

// Starts the watchdog once per process when ATOLL_LAUNCHER_PID is set (by `atoll launch`);
// does nothing otherwise. Grace: ATOLL_LAUNCHER_GRACE seconds (default 30).
void start_launcher_watch();

}  // namespace atl::comm
