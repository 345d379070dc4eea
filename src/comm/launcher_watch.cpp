#include "comm/launcher_watch.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "comm/tcp_store.h"
#include "core/error.h"

namespace atl::comm {

namespace {

long env_long(const char* name, long def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return end != v && *end == 0 ? x : def;
}

// send_term: false when the kernel's parent-death SIGTERM has already been delivered; a second
// SIGTERM would tell the trainer to stop at once instead of at the step's end with a checkpoint.
[[noreturn]] void launcher_gone(const std::string& why, long grace_s, bool send_term) {
  std::string rank = std::getenv("RANK") ? std::getenv("RANK") : "?";
  std::string msg = "atoll: rank " + rank + ": " + why + "; stopping (exit in " + std::to_string(grace_s) +
                    " s unless done before)\n";
  // stderr may be the dead launcher's pipe: say it where it can be seen, and never die of it.
  ::signal(SIGPIPE, SIG_IGN);
  (void)!::write(2, msg.data(), msg.size());
  if (send_term) ::kill(::getpid(), SIGTERM);
  std::this_thread::sleep_for(std::chrono::seconds(grace_s));
  const char* late = "atoll: still running after the grace period; exiting now\n";
  (void)!::write(2, late, std::char_traits<char>::length(late));
  ::_exit(1);
}

}  // namespace

void start_launcher_watch() {
  static std::atomic<bool> started{false};
  long launcher = env_long("ATOLL_LAUNCHER_PID", 0);
  if (launcher <= 0 || started.exchange(true)) return;
  long grace = std::max(1L, env_long("ATOLL_LAUNCHER_GRACE", 30));
  const char* addr = std::getenv("ATOLL_STORE_ADDR");
  long port = env_long("ATOLL_STORE_PORT", 0);
  std::string store_addr = addr && *addr ? addr : "127.0.0.1";
  std::thread([launcher, grace, store_addr, port] {
    std::unique_ptr<TcpStore> store;
    int misses = 0;
    for (int tick = 0;; ++tick) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      if (::getppid() != pid_t(launcher))
        launcher_gone("its launcher (`atoll launch`, pid " + std::to_string(launcher) + ") is gone", grace, false);
      if (port <= 0 || tick % 4 != 0) continue;
      // The store heartbeat: node 0's launcher hosts the store, so another node learns of its
      // death here. Three missed beats in a row (3 s) are a death, not a hiccup.
      try {
        if (!store) store = std::make_unique<TcpStore>(store_addr, int(port), std::chrono::milliseconds(2000));
        store->check({});
        misses = 0;
      } catch (const std::exception&) {
        store.reset();
        if (++misses >= 3)
          launcher_gone("the rendezvous store of its launcher at " + store_addr + ":" + std::to_string(port) +
                            " stopped answering (the launcher on node 0 is gone)",
                        grace, true);
      }
    }
  }).detach();
}

}  // namespace atl::comm
