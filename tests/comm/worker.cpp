// The rank side of the multi-process tests: `test_comm --worker MODE ...`, started by
// `atoll launch`, mpirun or the network-namespace test bed.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm_test_util.h"

namespace atl::comm::test {

namespace {

int suite(const std::string& backend) {
  auto c = make_communicator(backend, default_timeout());
  int k = check_all_collectives(*c);
  std::printf("suite ok: rank %d of %d on %s, %d checks\n", c->rank(), c->size(), c->backend().c_str(), k);
  return 0;
}

// All ranks loop over all_reduce; the victim kills (or stops) itself mid-loop, which the others
// must turn into an error naming it, within their timeout.
int fault(int victim, const std::string& how, int after) {
  auto c = make_communicator("auto", default_timeout());
  Tensor t = Tensor::full({4096}, 1.0f);
  for (int it = 0; it < 100000; ++it) {
    if (c->rank() == victim && it == after) {
      std::fflush(stdout);
      // A hang comes after a while of normal progress, which the heartbeat has reported.
      if (how == "stop") usleep(500000);
      raise(how == "stop" ? SIGSTOP : SIGKILL);
    }
    c->all_reduce(t, ReduceOp::max);
  }
  std::printf("no failure seen\n");
  return 0;
}

// A rank that ignores SIGTERM (so the parent-death signal alone cannot end it) and keeps
// all_reducing: only the launcher watchdog ends it once the launcher is gone. Its pid and stderr go
// to files in dir, since the launcher's pipes die with the launcher.
int orphan(const std::string& dir) {
  ::signal(SIGTERM, SIG_IGN);
  std::string rank = std::getenv("RANK") ? std::getenv("RANK") : "0";
  std::FILE* err = std::freopen((dir + "/err." + rank).c_str(), "w", stderr);
  if (!err) return 4;
  std::setvbuf(stderr, nullptr, _IONBF, 0);
  auto c = make_communicator("auto", default_timeout());
  if (std::FILE* f = std::fopen((dir + "/pid." + rank).c_str(), "w")) {
    std::fprintf(f, "%d\n", int(::getpid()));
    std::fclose(f);
  }
  Tensor t = Tensor::full({16}, 1.0f);
  for (;;) {
    c->all_reduce(t, ReduceOp::max);
    usleep(50000);
  }
}

// A 2-host job across network namespaces: one all_reduce whose result every rank checks.
int hosts() {
  auto c = make_communicator("auto", default_timeout());
  Tensor t = Tensor::full({100003}, float(c->rank() + 1));
  c->all_reduce(t, ReduceOp::sum);
  float want = float(c->size() * (c->size() + 1) / 2);
  for (int64_t i = 0; i < t.numel(); ++i)
    if (t.data<float>()[i] != want) fail("element {} is {}, expected {}", i, t.data<float>()[i], want);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::printf("hosts ok: rank %d of %d, sum %g\n", c->rank(), c->size(), double(want));
  return 0;
}

}  // namespace

int run_worker(int argc, char** argv) {
  try {
    std::string mode = argc > 0 ? argv[0] : "";
    if (mode == "suite" && argc == 2) return suite(argv[1]);
    if (mode == "fault" && argc == 4) return fault(std::atoi(argv[1]), argv[2], std::atoi(argv[3]));
    if (mode == "hosts") return hosts();
    if (mode == "orphan" && argc == 2) return orphan(argv[1]);
    std::fprintf(stderr, "usage: test_comm --worker suite BACKEND | fault VICTIM kill|stop AFTER | hosts\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker error: %s\n", e.what());
    return 3;
  }
}

}  // namespace atl::comm::test
