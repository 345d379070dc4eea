#include "train/stop_signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

namespace atl {
namespace {

volatile sig_atomic_t g_stop = 0;
std::atomic<int> g_depth{0};
struct sigaction g_old_term, g_old_int, g_old_pipe;

void on_stop(int sig) {
  // A second Ctrl-C means "now". A repeated SIGTERM does not: the parent-death signal can arrive
  // once per thread of a dying multi-threaded launcher, and schedulers follow up with SIGKILL.
  if (g_stop && sig == SIGINT) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  g_stop = sig;
}

}  // namespace

StopSignalGuard::StopSignalGuard() {
  if (g_depth++ > 0) return;
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  // Restart interrupted calls: the signal lands on any thread, and a transport's read or write
  // failing with EINTR would turn "stop after this step" into a failed collective.
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, &g_old_term);
  ::sigaction(SIGINT, &sa, &g_old_int);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, &g_old_pipe);
}

StopSignalGuard::~StopSignalGuard() {
  if (--g_depth > 0) return;
  ::sigaction(SIGTERM, &g_old_term, nullptr);
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGPIPE, &g_old_pipe, nullptr);
}

void route_stop_signals() {
  static std::atomic<bool> routed{false};
  if (routed.exchange(true)) return;
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  ::pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::thread([stop] {
    ::pthread_sigmask(SIG_UNBLOCK, &stop, nullptr);
    for (;;) ::pause();  // the handler (or the default action) runs here
  }).detach();
}

int stop_requested() { return int(g_stop); }
void clear_stop_request() { g_stop = 0; }

}  // namespace atl
