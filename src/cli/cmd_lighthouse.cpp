// `atoll lighthouse`: the quorum server of fault-tolerant data parallelism (resilience/lighthouse.h),
// and `atoll lighthouse --status HOST:PORT`, the observer's answer (who is alive, stopped, dead).
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <thread>

#include "cli/command.h"
#include "cli/number_checks.h"
#include "core/error.h"
#include "core/log.h"
#include "resilience/lighthouse.h"
#include "resilience/line_socket.h"

namespace atl::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

int run_lighthouse(int argc, char** argv) {
  resilience::LighthouseOptions o;
  int64_t timeout_ms = o.heartbeat_timeout.count();
  std::string status;
  CLI::App app{"Serve the per-step quorum of fault-tolerant data parallelism ([fault] tolerance = \"quorum\")"};
  app.add_option("--host", o.host, "address to listen on");
  app.add_option("--port", o.port, "port (0: pick a free one, printed)")->check(integer_in(0, 65535));
  app.add_option("--heartbeat-timeout-ms", timeout_ms, "a replica silent this long leaves the quorum")
      ->check(integer_in(10, 3600000));
  app.add_option("--min-replicas", o.min_replicas, "replicas the first quorum waits for")->check(integer_in(1, 1 << 20));
  int64_t refill_ms = o.refill_timeout.count();
  app.add_option("--slots", o.slots, "DeadPool: the job's size; a dead replica's slot goes to a waiting spare")
      ->check(integer_in(0, 1 << 20));
  app.add_option("--refill-timeout-ms", refill_ms, "DeadPool: how long a quorum waits for the spare given a slot")
      ->check(integer_in(100, 3600000));
  app.add_option("--status", status, "HOST:PORT: print a running lighthouse's view of the replicas (JSON) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!status.empty()) {
    auto colon = status.rfind(':');
    ATOLL_CHECK(colon != std::string::npos && colon > 0, "--status '{}' is not HOST:PORT", status);
    resilience::LineConn c(resilience::connect_to(status.substr(0, colon), std::atoi(status.c_str() + colon + 1),
                                                  resilience::Millis(5000)));
    std::string r;
    ATOLL_CHECK(c.send_line("W") && c.read_line(r, resilience::Millis(5000)) && r.rfind("W ", 0) == 0,
                "the lighthouse at {} did not answer", status);
    std::printf("%s\n", r.c_str() + 2);
    return 0;
  }
  o.heartbeat_timeout = std::chrono::milliseconds(timeout_ms);
  o.refill_timeout = std::chrono::milliseconds(refill_ms);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  resilience::Lighthouse lh(o);
  std::printf("lighthouse listening on %s:%d (store port %d, heartbeat timeout %lld ms)\n", o.host.c_str(), lh.port(),
              lh.store_port(), static_cast<long long>(timeout_ms));
  std::fflush(stdout);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return 0;
}

Registrar reg({"lighthouse", "serve the per-step quorum of fault-tolerant data parallelism", run_lighthouse});

}  // namespace
}  // namespace atl::cli
