// `atoll launch`: runs a command as the ranks of a distributed job (see comm/launcher.h).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unistd.h>

#include "cli/command.h"
#include "cli/number_checks.h"
#include "comm/launcher.h"
#include "core/error.h"
#include "core/log.h"
#include "resilience/lighthouse.h"

namespace atl::cli {

static int run_launch(int argc, char** argv) {
  // Everything after "--" is the command; CLI11 only sees what comes before.
  int split = argc;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--")) {
      split = i;
      break;
    }
  comm::LaunchOptions o;
  std::string rdzv;
  CLI::App app{"Run a command as the ranks of a distributed job: atoll launch [options] -- CMD ARGS..."};
  app.add_option("--nproc-per-node", o.nproc_per_node, "ranks on this node")->check(integer_in(1, 4096));
  app.add_option("--nnodes", o.nnodes, "number of nodes")->check(integer_in(1, 1 << 20));
  app.add_option("--node-rank", o.node_rank, "this node's index, 0..nnodes-1")->check(integer_in(0, (1 << 20) - 1));
  app.add_option("--rdzv", rdzv, "HOST:PORT of node 0's rendezvous store (multi-node)");
  app.add_option("--timeout", o.timeout_s, "collective timeout in seconds for every rank (ATOLL_COMM_TIMEOUT)")
      ->check(finite_number(true));
  app.add_option("--connect-timeout", o.connect_timeout_s,
                 "seconds to keep trying to reach the store and the peers at start-up (ATOLL_CONNECT_TIMEOUT; "
                 "default: the smaller of the collective timeout and 60)")
      ->check(finite_number(true));
  app.add_option("--grace", o.grace_s, "seconds the other ranks get to exit after one fails")
      ->check(finite_number(true));
  // issue 14: fault-tolerant data parallelism (docs/fault_tolerance.md).
  bool ft = false;
  int64_t ft_timeout_ms = 300;
  app.add_flag("--ft", ft,
               "fault tolerance: host a lighthouse, run `atoll train` ranks as quorum replicas, and start a failed "
               "rank again with --resume instead of stopping the job");
  app.add_option("--max-restarts", o.max_restarts,
                 "restarts in all before the job is stopped: without --ft, a failed rank restarts the whole job "
                 "(`atoll train` with --resume; TORCHELASTIC_RESTART_COUNT); with --ft, the failed rank alone "
                 "(default 3 with --ft, 0 without)")
      ->check(integer_in(0, 1 << 20));
  app.add_option("--heartbeat-timeout-ms", ft_timeout_ms, "with --ft: a replica silent this long leaves the quorum")
      ->check(integer_in(10, 3600000));
  app.add_option("--spares", o.spares,
                 "with --ft: hot spares (DeadPool) started beside the replicas; a dead replica's slot goes to a spare, "
                 "restored from its peer's in-memory snapshot ([fault] snapshot_every), instead of a restart")
      ->check(integer_in(0, 4096));
  // issue 15: a job that outlives dead ranks (RL's shadow rank takes over a rollout rank, docs/rl.md).
  app.add_option("--outlive", o.outlive, "ranks that may die without stopping the job (RL with rl.shadow_ranks)")
      ->check(integer_in(0, 1 << 20));
  // issue 14: the external watcher (resilience/watcher.h, `atoll watch`).
  bool watch = false;
  double watch_hang_s = 60;
  std::string watch_dir;
  app.add_flag("--watch", watch, "start `atoll watch` beside the ranks: a hang is named and stops the job");
  app.add_option("--watch-hang-s", watch_hang_s, "with --watch: seconds without progress (and CPU) that make a hang")
      ->check(CLI::Range(0.5, 86400.0));
  app.add_option("--watch-dir", watch_dir, "with --watch: where the ranks publish their progress records "
                 "(ATOLL_PROGRESS_DIR; default a fresh directory under /tmp)");
  try {
    app.parse(split, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!rdzv.empty()) {
    auto colon = rdzv.rfind(':');
    ATOLL_CHECK(colon != std::string::npos && colon > 0, "--rdzv '{}' is not HOST:PORT", rdzv);
    o.rdzv_host = rdzv.substr(0, colon);
    try {
      o.rdzv_port = std::stoi(rdzv.substr(colon + 1));
    } catch (const std::exception&) {
      fail("--rdzv '{}': the port is not a number", rdzv);
    }
  }
  ATOLL_CHECK(o.spares == 0 || ft, "--spares {}: spares take a dead replica's place in a quorum job: use it with --ft",
              o.spares);
  for (int i = split + 1; i < argc; ++i) o.cmd.push_back(argv[i]);
  ATOLL_CHECK(!o.cmd.empty(), "no command: use `atoll launch [options] -- CMD ARGS...`");
  if (watch) {
    if (watch_dir.empty()) watch_dir = fmt::format("/tmp/atoll-watch-{}", ::getpid());
    std::error_code ec;
    std::filesystem::create_directories(watch_dir, ec);
    ATOLL_CHECK(!ec, "--watch-dir {}: {}", watch_dir, ec.message());
    ::setenv("ATOLL_PROGRESS_DIR", watch_dir.c_str(), 1);  // the ranks inherit it (train/fault_hooks.h)
    o.watch_cmd = {"/proc/self/exe", "watch", watch_dir, "--ranks", std::to_string(o.nproc_per_node), "--hang-s",
                   fmt::format("{}", watch_hang_s), "--window-s", fmt::format("{}", std::min(2.0, watch_hang_s)),
                   "--report-every-s", "60", "--quiet"};
  }
  if (ft && !o.watch_cmd.empty()) o.watch_cmd.push_back("--tolerant");  // replicas go on without a dead one
  if (!ft) {
    // issue 14: torchrun's whole-job restart. An `atoll train` job goes on from its last committed
    // checkpoint: --resume (which starts from scratch when there is none yet), never --overwrite.
    o.restart_group = true;
    if (o.max_restarts > 0 && o.cmd.size() >= 2 && o.cmd[1] == "train") {
      for (auto& a : o.cmd)
        if (a != "--overwrite") o.restart_cmd.push_back(a);
      if (std::find(o.restart_cmd.begin(), o.restart_cmd.end(), "--resume") == o.restart_cmd.end())
        o.restart_cmd.push_back("--resume");
    }
    return comm::launch(o);
  }
  ATOLL_CHECK(o.nnodes == 1, "--ft runs on one node for now (start `atoll lighthouse` and the replicas by hand "
                             "across nodes: docs/fault_tolerance.md)");
  resilience::LighthouseOptions lo;
  lo.host = "127.0.0.1";
  lo.heartbeat_timeout = std::chrono::milliseconds(ft_timeout_ms);
  lo.min_replicas = o.nproc_per_node;
  if (o.spares > 0) {
    lo.slots = o.nproc_per_node;  // the lighthouse keeps the spare pool (resilience/lighthouse.h)
    o.spare_args = {"--fault.spare=true"};
  }
  resilience::Lighthouse lighthouse(lo);
  std::string addr = fmt::format("127.0.0.1:{}", lighthouse.port());
  ::setenv("ATOLL_LIGHTHOUSE", addr.c_str(), 1);
  std::fprintf(stderr, "atoll launch: lighthouse on %s (heartbeat timeout %lld ms)\n", addr.c_str(),
               static_cast<long long>(ft_timeout_ms));
  if (o.cmd.size() >= 2 && o.cmd[1] == "train") o.cmd.push_back("--fault.tolerance=quorum");
  if (!app.count("--max-restarts")) o.max_restarts = 3;
  o.restart_args = {"--resume"};
  return comm::launch(o);
}

static Registrar reg({"launch", "run a command as N ranks (torchrun-style env, fail-fast teardown)", run_launch});

}  // namespace atl::cli
