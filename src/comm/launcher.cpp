// Launcher: torchrun's (torch.distributed.run) contract — the RANK/LOCAL_RANK/WORLD_SIZE/
// LOCAL_WORLD_SIZE/GROUP_RANK/MASTER_ADDR/MASTER_PORT environment, a TCP store on node 0 — with
// a fail-fast policy: the first rank that exits non-zero (or dies by a signal) fails the whole
// job. The other ranks get a short grace period to report their own errors (a dead peer makes
// their collectives fail within their timeout), then SIGTERM, then SIGKILL. Across nodes the
// failure travels through the store, so every node's launcher tears down its ranks.
#include "comm/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "comm/tcp_store.h"
#include "core/error.h"

namespace atl::comm {

namespace {

volatile sig_atomic_t g_interrupted = 0;
void on_signal(int sig) { g_interrupted = sig; }

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int fds[2] = {-1, -1};  // stdout, stderr read ends
  std::string partial[2];
  bool exited = false;
  int status = 0;
  bool signalled = false;  // the launcher's teardown signalled it before it exited
};

void write_fd(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t k = ::write(fd, s.data() + off, s.size() - off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;
    off += size_t(k);
  }
}

// Emits complete lines, each prefixed with the rank; keeps the unfinished tail.
void emit_lines(Child& c, int stream, const char* data, size_t n, bool flush) {
  std::string& buf = c.partial[stream];
  buf.append(data, n);
  std::string out;
  size_t start = 0, nl;
  while ((nl = buf.find('\n', start)) != std::string::npos) {
    out += "[rank " + std::to_string(c.rank) + "] " + buf.substr(start, nl - start + 1);
    start = nl + 1;
  }
  buf.erase(0, start);
  if (flush && !buf.empty()) {
    out += "[rank " + std::to_string(c.rank) + "] " + buf + "\n";
    buf.clear();
  }
  if (!out.empty()) write_fd(stream == 0 ? 1 : 2, out);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int s = WTERMSIG(status);
    const char* name = sigabbrev_np(s);
    return fmt::format("was killed by signal {} (SIG{})", s, name ? name : "?");
  }
  return fmt::format("ended with status {}", status);
}

pid_t spawn(const LaunchOptions& o, Child& c, int local_rank, int store_port, int master_port, int restart_count) {
  int out[2], err[2];
  ATOLL_CHECK(::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0, "pipe(): {}",
              std::strerror(errno));
  // Everything the child needs is prepared before fork: only async-signal-safe calls after it.
  std::vector<std::string> envs = {
      "RANK=" + std::to_string(c.rank),
      "LOCAL_RANK=" + std::to_string(local_rank),
      "WORLD_SIZE=" + std::to_string(o.nproc_per_node * o.nnodes),
      "LOCAL_WORLD_SIZE=" + std::to_string(o.nproc_per_node),
      "GROUP_RANK=" + std::to_string(o.node_rank),
      "MASTER_ADDR=" + o.rdzv_host,
      "MASTER_PORT=" + std::to_string(master_port),
      "ATOLL_STORE_ADDR=" + o.rdzv_host,
      "ATOLL_STORE_PORT=" + std::to_string(store_port),
      // The rank's watchdog (comm/launcher_watch.h) ends it when this process is gone.
      "ATOLL_LAUNCHER_PID=" + std::to_string(::getpid()),
      // torchrun's names: how many times the job (with --ft: this node's ranks) was started
      // again, and the most it may be (train/trainer.cpp logs and records the count).
      "TORCHELASTIC_RESTART_COUNT=" + std::to_string(restart_count),
      "TORCHELASTIC_MAX_RESTARTS=" + std::to_string(o.max_restarts),
  };
  if (o.timeout_s > 0) envs.push_back(fmt::format("ATOLL_COMM_TIMEOUT={}", o.timeout_s));
  if (o.connect_timeout_s > 0) envs.push_back(fmt::format("ATOLL_CONNECT_TIMEOUT={}", o.connect_timeout_s));
  // Like torchrun: ranks sharing a node share its cores unless the user says otherwise.
  if (!std::getenv("OMP_NUM_THREADS")) {
    unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    envs.push_back("OMP_NUM_THREADS=" + std::to_string(std::max(1u, hw / unsigned(o.nproc_per_node))));
  }
  std::vector<std::string> keep;
  for (char** e = environ; *e; ++e) {
    std::string s = *e;
    std::string k = s.substr(0, s.find('='));
    bool overridden = false;
    for (auto& v : envs)
      if (v.compare(0, k.size() + 1, k + "=") == 0) overridden = true;
    if (!overridden) keep.push_back(s);
  }
  for (auto& v : envs) keep.push_back(v);
  std::vector<char*> envp, argv;
  for (auto& s : keep) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> cmd = o.cmd;
  for (auto& s : cmd) argv.push_back(s.data());
  argv.push_back(nullptr);

  const pid_t launcher = ::getpid();
  pid_t pid = ::fork();
  ATOLL_CHECK(pid >= 0, "fork(): {}", std::strerror(errno));
  if (pid == 0) {
    // A rank dies with its launcher, even by kill -9: SIGTERM when we go (the trainer then stops
    // at the step's end), checked once more in case we went before the request was made.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher) ::_exit(1);
    ::setpgid(0, 0);  // its own group: teardown reaches the rank's children too
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);  // ignored dispositions survive exec
    ::execvpe(argv[0], argv.data(), envp.data());
    const char* msg = "atoll launch: cannot execute the command: ";
    (void)!::write(2, msg, std::strlen(msg));
    const char* e = std::strerror(errno);
    (void)!::write(2, e, std::strlen(e));
    (void)!::write(2, "\n", 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  ::close(out[1]);
  ::close(err[1]);
  c.fds[0] = out[0];
  c.fds[1] = err[0];
  return pid;
}

}  // namespace

namespace {

// One start of this node's ranks, to its end: every rank exited, or the job torn down.
struct Attempt {
  std::string failure;  // the first failure, as reported; empty: every rank exited 0
  bool interrupted = false;  // the launcher itself was signalled: never restarted
  int failed_rank = -1;      // the rank whose end began the teardown (-1: the watcher, a signal, another node)
  std::vector<Child> kids;
};

Attempt run_attempt(const LaunchOptions& o, int attempt, TcpStore& store, int port, int master_port) {
  using clock = std::chrono::steady_clock;
  using Millis = std::chrono::milliseconds;
  Attempt a;
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const int64_t start_ns = int64_t(now.tv_sec) * 1000000000 + now.tv_nsec;  // the progress records' clock
  auto& kids = a.kids;
  kids.resize(size_t(o.nproc_per_node));
  LaunchOptions first = o;
  if (attempt > 0 && !o.restart_cmd.empty()) first.cmd = o.restart_cmd;
  for (int i = 0; i < o.nproc_per_node; ++i) {
    kids[size_t(i)].rank = o.node_rank * o.nproc_per_node + i;
    kids[size_t(i)].pid = spawn(first, kids[size_t(i)], i, port, master_port, attempt);
  }

  // issue 14: the watcher, a plain child (its output goes straight to ours).
  pid_t watcher = 0;
  if (!o.watch_cmd.empty()) {
    std::vector<std::string> wc = o.watch_cmd;
    // The records of an earlier start are in the same directory until the new ranks replace them.
    wc.push_back("--ignore-before-ns");
    wc.push_back(std::to_string(start_ns));
    std::vector<char*> wargv;
    for (auto& s : wc) wargv.push_back(s.data());
    wargv.push_back(nullptr);
    watcher = ::fork();
    ATOLL_CHECK(watcher >= 0, "fork(): {}", std::strerror(errno));
    if (watcher == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::signal(SIGPIPE, SIG_DFL);
      ::execvp(wargv[0], wargv.data());
      ::_exit(127);
    }
  }
  std::string& failure = a.failure;
  int restarts = 0;     // ranks started again (max_restarts, --ft)
  int outlived = 0;     // ranks the job went on without (outlive)
  clock::time_point term_at{}, kill_at{};
  bool termed = false, killed = false;
  auto last_store_check = clock::now();
  auto begin_teardown = [&](const std::string& why, bool immediate) {
    if (!failure.empty()) return;
    failure = why;
    std::fprintf(stderr, "atoll launch: %s; stopping the other ranks\n", why.c_str());
    std::fflush(stderr);
    try {
      if (!store.check({"launch/failed"})) store.set("launch/failed", why);
    } catch (const Error&) {
    }
    term_at = clock::now() + (immediate ? Millis(0) : Millis(int64_t(o.grace_s * 1000)));
    kill_at = term_at + Millis(3000);
  };

  // A job may declare the ranks it can go on without (`launch/outlivable/<rank>`, with
  // `launch/outlive_declared`: an RL job's rollout ranks, rl/shadow_channel.cpp); another rank's
  // failure then stops the job at once, naming it, whatever --outlive allows.
  auto outlive_refused = [&](int rank, int pid, int st) {
    try {
      if (!store.check({"launch/outlive_declared"}) || store.check({"launch/outlivable/" + std::to_string(rank)}))
        return false;
      const std::string why = store.try_get("launch/outlive_declared").value_or("");
      begin_teardown(fmt::format("rank {} (pid {}) {}; the job cannot go on without it ({})", rank, pid,
                                 describe_status(st), why),
                     false);
      return true;
    } catch (const Error&) {
      return false;
    }
  };

  char buf[65536];
  for (;;) {
    std::vector<pollfd> pfds;
    std::vector<std::pair<size_t, int>> who;
    for (size_t i = 0; i < kids.size(); ++i)
      for (int s = 0; s < 2; ++s)
        if (kids[i].fds[s] >= 0) {
          pfds.push_back({kids[i].fds[s], POLLIN, 0});
          who.push_back({i, s});
        }
    if (!pfds.empty()) ::poll(pfds.data(), pfds.size(), 100);
    for (size_t j = 0; j < pfds.size(); ++j) {
      if (!(pfds[j].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto [i, s] = who[j];
      ssize_t n = ::read(pfds[j].fd, buf, sizeof buf);
      if (n > 0) {
        emit_lines(kids[i], s, buf, size_t(n), false);
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        emit_lines(kids[i], s, "", 0, true);
        ::close(kids[i].fds[s]);
        kids[i].fds[s] = -1;
      }
    }
    for (auto& c : kids) {
      if (!c.exited) {
        int st = 0;
        pid_t r = ::waitpid(c.pid, &st, WNOHANG);
        if (r == c.pid) {
          c.exited = true;
          c.status = st;
          if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !o.restart_group && restarts < o.max_restarts &&
              failure.empty() && !g_interrupted) {
            ++restarts;
            std::fprintf(stderr, "atoll launch: rank %d (pid %d) %s; starting it again (restart %d of %d)\n", c.rank,
                         int(c.pid), describe_status(st).c_str(), restarts, o.max_restarts);
            std::fflush(stderr);
            for (int s = 0; s < 2; ++s)
              if (c.fds[s] >= 0) {
                emit_lines(c, s, "", 0, true);
                ::close(c.fds[s]);
                c.fds[s] = -1;
              }
            LaunchOptions again = o;
            again.cmd.insert(again.cmd.end(), o.restart_args.begin(), o.restart_args.end());
            c.exited = false;
            c.signalled = false;
            c.pid = spawn(again, c, c.rank - o.node_rank * o.nproc_per_node, port, master_port, restarts);
          } else if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && outlived < o.outlive && failure.empty() &&
                     !g_interrupted && !outlive_refused(c.rank, int(c.pid), st)) {
            ++outlived;
            std::fprintf(stderr, "atoll launch: rank %d (pid %d) %s; the job goes on without it (%d of %d)\n", c.rank,
                         int(c.pid), describe_status(st).c_str(), outlived, o.outlive);
            std::fflush(stderr);
          } else if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            if (failure.empty()) a.failed_rank = c.rank;
            begin_teardown(fmt::format("rank {} (pid {}) {}", c.rank, c.pid, describe_status(st)),
                           false);
          }
        }
      }
    }
    if (watcher > 0) {
      int st = 0;
      if (::waitpid(watcher, &st, WNOHANG) == watcher) {
        watcher = 0;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 3) begin_teardown("the watcher named a hang (its message is above)", true);
      }
    }
    if (pfds.empty()) std::this_thread::sleep_for(Millis(50));
    bool all_exited = std::all_of(kids.begin(), kids.end(), [](const Child& c) { return c.exited; });
    bool outputs_closed = std::all_of(kids.begin(), kids.end(),
                                      [](const Child& c) { return c.fds[0] < 0 && c.fds[1] < 0; });
    if (all_exited && (outputs_closed || killed)) break;
    if (g_interrupted && failure.empty()) {
      a.interrupted = true;
      begin_teardown(fmt::format("interrupted by signal {}", int(g_interrupted)), true);
    }
    // Another node's failure reaches us through the store.
    if (o.nnodes > 1 && failure.empty() && clock::now() - last_store_check > Millis(250)) {
      last_store_check = clock::now();
      try {
        if (auto f = store.try_get("launch/failed")) begin_teardown("on another node: " + *f, false);
      } catch (const Error& e) {
        begin_teardown(std::string("lost the rendezvous store: ") + e.what(), false);
      }
    }
    if (!failure.empty()) {
      auto now = clock::now();
      if (!termed && now >= term_at) {
        termed = true;
        for (auto& c : kids)
          if (!c.exited) {
            c.signalled = true;
            ::kill(-c.pid, SIGTERM);
            ::kill(-c.pid, SIGCONT);  // a stopped rank must run to act on SIGTERM
          }
      }
      if (!killed && now >= kill_at) {
        killed = true;
        for (auto& c : kids)
          if (!c.exited) ::kill(-c.pid, SIGKILL);
      }
      // Grandchildren may hold the pipes open after SIGKILL: stop reading a little later.
      if (killed && all_exited && now >= kill_at + Millis(1000)) break;
    }
  }
  for (auto& c : kids)
    for (int s = 0; s < 2; ++s)
      if (c.fds[s] >= 0) ::close(c.fds[s]);
  if (watcher > 0) {  // the job ended first: the watcher has nothing left to watch
    ::kill(watcher, SIGTERM);
    int st = 0;
    ::waitpid(watcher, &st, 0);
  }
  return a;
}

// issue 14: the evidence a resumed run localizes a fatal fault with (train/fault_campaign_hook.h).
void write_failure_file(const Attempt& a) {
  const char* ff = std::getenv("ATOLL_FAILURE_FILE");
  if (!ff || !*ff) return;
  std::string lines;
  for (auto& c : a.kids)
    lines += fmt::format("{{\"rank\": {}, \"status\": \"{}\", \"torn_down\": {}}}\n", c.rank,
                         describe_status(c.status), c.signalled ? "true" : "false");
  if (FILE* f = std::fopen(ff, "a")) {
    std::fputs(lines.c_str(), f);
    std::fclose(f);
  }
}

}  // namespace

int launch(const LaunchOptions& o) {
  ATOLL_CHECK(!o.cmd.empty(), "atoll launch: no command given after --");
  ATOLL_CHECK(o.nproc_per_node >= 1, "--nproc-per-node must be at least 1");
  ATOLL_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes,
              "--node-rank {} is outside 0..{}", o.node_rank, o.nnodes - 1);
  ATOLL_CHECK(o.nnodes == 1 || o.rdzv_port > 0,
              "a multi-node launch needs --rdzv HOST:PORT naming node 0's address");
  ATOLL_CHECK(!(o.restart_group && o.max_restarts > 0 && o.nnodes > 1),
              "--max-restarts: whole-job restarts run on one node for now (every node's launcher would have to "
              "agree on each new start); across nodes restart the job by hand with --resume");
  using Millis = std::chrono::milliseconds;

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int, old_term;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  // If our own output goes away (`atoll launch ... | head`), keep running and tearing down
  // properly instead of dying and orphaning the ranks.
  auto old_pipe = ::signal(SIGPIPE, SIG_IGN);

  // Whole-job restarts: a restarted run localizes the failure from the failure file; without one
  // of the user's, a private one for the job's lifetime.
  std::string own_failure_dir;
  if (o.restart_group && o.max_restarts > 0 && !(std::getenv("ATOLL_FAILURE_FILE") && *std::getenv("ATOLL_FAILURE_FILE"))) {
    char tmpl[] = "/tmp/atoll-launch-XXXXXX";
    if (::mkdtemp(tmpl)) {
      own_failure_dir = tmpl;
      ::setenv("ATOLL_FAILURE_FILE", (own_failure_dir + "/failures.jsonl").c_str(), 1);
    }
  }

  Attempt a;
  for (int attempt = 0;; ++attempt) {
    // Node 0 hosts the store; a single-node job keeps it on loopback. A fresh store per start: the
    // ranks' rendezvous keys of the previous start must not meet the new ranks.
    std::unique_ptr<TcpStoreServer> server;
    int port = o.rdzv_port;
    if (o.node_rank == 0) {
      server = std::make_unique<TcpStoreServer>(o.nnodes > 1 ? "0.0.0.0" : o.rdzv_host, attempt == 0 ? port : 0);
      port = server->port();
    }
    Millis store_timeout(int64_t(1000 * std::max(60.0, o.timeout_s)));
    auto store = std::make_unique<TcpStore>(o.rdzv_host, port, store_timeout,
                                           o.connect_timeout_s > 0 ? Millis(int64_t(o.connect_timeout_s * 1000)) : Millis(-1));
    // MASTER_PORT stays free for rank 0's own use (torch.distributed's env:// store, say): the
    // next port on a multi-node job, so that every node agrees without asking; a free one here.
    int master_port = o.nnodes > 1 ? o.rdzv_port + 1 : pick_free_port(o.rdzv_host);

    a = run_attempt(o, attempt, *store, port, master_port);

    // Node 0 keeps the store up until every node's launcher is done with it.
    try {
      store->set("launch/done/" + std::to_string(o.node_rank), "1");
      if (server && o.nnodes > 1) {
        std::vector<std::string> keys;
        for (int n = 0; n < o.nnodes; ++n) keys.push_back("launch/done/" + std::to_string(n));
        store->wait(keys, Millis(a.failure.empty() ? 30000 : 5000));
      }
    } catch (const Error&) {
    }
    store.reset();
    server.reset();
    if (a.failure.empty()) break;
    write_failure_file(a);
    if (!o.restart_group || attempt >= o.max_restarts || a.interrupted || g_interrupted) break;
    // torchrun's policy: any rank's failure restarts the whole group, every rank from the start of
    // its command (an `atoll train` from its last committed checkpoint: restart_cmd has --resume).
    std::fprintf(stderr, "atoll launch: restarting the whole job (restart %d of %d, TORCHELASTIC_RESTART_COUNT=%d): %s%s\n",
                 attempt + 1, o.max_restarts, attempt + 1,
                 a.failed_rank >= 0 ? fmt::format("failed rank {}: ", a.failed_rank).c_str() : "", a.failure.c_str());
    std::fflush(stderr);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  ::signal(SIGPIPE, old_pipe);
  if (!own_failure_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(own_failure_dir, ec);
    ::unsetenv("ATOLL_FAILURE_FILE");
  }

  if (a.failure.empty()) return 0;
  std::fprintf(stderr, "atoll launch: job failed: %s\n", a.failure.c_str());
  for (auto& c : a.kids)
    if (!(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0))
      std::fprintf(stderr, "atoll launch:   rank %d %s\n", c.rank, describe_status(c.status).c_str());
  if (o.restart_group && o.max_restarts > 0 && !a.interrupted)
    std::fprintf(stderr,
                 "atoll launch: gave up: every one of the %d restart(s) allowed (--max-restarts) was used and the "
                 "job failed again; nothing was deleted: the run's checkpoints are where it wrote them (an `atoll "
                 "train` job continues from its last one with --resume)\n",
                 o.max_restarts);
  return 1;
}

}  // namespace atl::comm
