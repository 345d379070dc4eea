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
#include <map>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

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
  int exit_order = -1;     // 0 for the first of this start's ranks to exit, 1 for the next...
  int64_t exit_ns = 0;     // when it was seen to exit (CLOCK_REALTIME: the nodes' exits are ordered by it)
  int spare_id = -1;       // a DeadPool spare (--spares): its ATOLL_SPARE_ID, also in `rank`
};

// "rank 3" or, for a spare, "spare 4".
std::string who_is(const Child& c) {
  return fmt::format("{} {}", c.spare_id >= 0 ? "spare" : "rank", c.rank);
}

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
    out += "[" + who_is(c) + "] " + buf.substr(start, nl - start + 1);
    start = nl + 1;
  }
  buf.erase(0, start);
  if (flush && !buf.empty()) {
    out += "[" + who_is(c) + "] " + buf + "\n";
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
  // A spare's RANK must be a valid rank of the job (the lighthouse gives it its slot later).
  std::vector<std::string> envs = {
      "RANK=" + std::to_string(c.spare_id >= 0 ? 0 : c.rank),
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
  if (c.spare_id >= 0) envs.push_back(fmt::format("ATOLL_SPARE_ID={}", c.spare_id));
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
  if (c.spare_id >= 0) cmd.insert(cmd.end(), o.spare_args.begin(), o.spare_args.end());
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
  std::string failure;  // the failure, as reported; empty: every rank exited 0
  bool interrupted = false;  // the launcher itself was signalled: never restarted
  int failed_rank = -1;      // the rank the job failed because of (-1: a signal, another node, a hang the watcher could not pin on one rank)
  std::vector<Child> kids;
  std::map<int, std::string> reports;  // this node's ranks' failure reports: rank -> "blamed ranks;why"
  bool by_watcher = false;   // the failure is this node's watcher's verdict
  std::vector<int> verdict;  // the ranks that verdict named
  int verdict_node = -1;     // several nodes: the node whose watcher it was, when not this one
};

// The ranks a report blames.
std::vector<int> blamed_in(const std::string& report) {
  std::vector<int> out;
  const std::string ranks = report.substr(0, report.find(';'));
  for (size_t at = 0; at < ranks.size();) {
    size_t comma = ranks.find(',', at);
    if (comma == std::string::npos) comma = ranks.size();
    try {
      out.push_back(std::stoi(ranks.substr(at, comma - at)));
    } catch (const std::exception&) {
    }
    at = comma + 1;
  }
  return out;
}

void read_reports(Attempt& a, TcpStore& store) {
  for (auto& c : a.kids) try {
      if (auto v = store.try_get("launch/report/" + std::to_string(c.rank))) a.reports[c.rank] = *v;
    } catch (const Error&) {
      return;  // the store is gone (a node-0 launcher that exited)
    }
}

// The ranks `atoll watch --verdict-file` named as a hang's cause: one line of ranks (empty when
// the file is missing: an older watcher, or one killed before it wrote).
std::vector<int> read_verdict(const std::string& path) {
  std::vector<int> out;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    int r = 0;
    while (std::fscanf(f, "%d", &r) == 1) out.push_back(r);
    std::fclose(f);
  }
  return out;
}

// The rank a start failed because of, which is not always the first to exit: when a rank stops
// answering (a timeout, a hang) its peers' collectives fail and they exit first, and the
// teardown ends the culprit afterwards. A rank whose collective failed has posted the ranks it
// blames under launch/report/<rank> (comm/gloo_communicator.cpp). In order of preference:
//  1. the first rank that ended on its own, not zero, without such a report (it failed by itself:
//     an exception, a kill from outside, exhausted memory; its peers' failures followed from it);
//  2. the rank this node's reports blame most often (a tie: the lowest);
//  3. the first to exit, as before.
// When that is not the first rank to exit, the failure's text says both.
void name_culprit(Attempt& a) {
  const std::map<int, std::string>& reports = a.reports;
  auto failed = [](const Child& c) { return c.exited && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0); };
  const Child* first = nullptr;
  for (auto& c : a.kids)
    if (failed(c) && (!first || c.exit_order < first->exit_order)) first = &c;
  if (!first) return;
  const Child* own = nullptr;
  for (auto& c : a.kids)
    if (failed(c) && !c.signalled && !reports.count(c.rank) && (!own || c.exit_order < own->exit_order)) own = &c;
  int culprit = -1;
  std::string blamers, why;
  if (own) {
    culprit = own->rank;
  } else {
    std::map<int, int> votes;
    for (auto& [r, v] : reports)
      for (int b : blamed_in(v)) ++votes[b];
    for (auto& [r, n] : votes)
      if (culprit < 0 || n > votes[culprit]) culprit = r;
  }
  if (culprit < 0 || culprit == first->rank) return;
  const Child* c = nullptr;
  for (auto& k : a.kids)
    if (k.rank == culprit) c = &k;
  for (auto& [r, v] : reports) {
    const auto b = blamed_in(v);
    if (!std::count(b.begin(), b.end(), culprit)) continue;
    blamers += fmt::format("{}{}", blamers.empty() ? "" : ", ", r);
    if (why.empty()) why = v.substr(v.find(';') + 1);
  }
  a.failed_rank = culprit;
  const std::string end = c ? fmt::format("(pid {}) {}{}", c->pid, describe_status(c->status),
                                          c->signalled ? " when torn down" : "")
                            : std::string("(on another node)");  // its own launcher says how it ended
  a.failure = fmt::format("rank {} {}{}; rank {} (pid {}) {} first{}", culprit, end,
                          blamers.empty() ? "" : fmt::format(", blamed by rank(s) {} whose collective failed: {}", blamers, why),
                          first->rank, first->pid, describe_status(first->status),
                          reports.count(first->rank) ? ", its collective having failed" : "");
}

// store: this start's rendezvous store (the ranks' own, with their failure reports); ctl and
// ctl_prefix: where the launchers of a multi-node job tell each other a start failed (one node:
// the same store, "launch/"; several: node 0's control store, "launch/<start>/").
Attempt run_attempt(const LaunchOptions& o, int attempt, TcpStore& store, TcpStore& ctl, const std::string& ctl_prefix,
                    int port, int master_port) {
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
  for (int i = 0; i < o.spares; ++i) {  // DeadPool's pool: they wait for a slot to take
    Child c;
    c.rank = c.spare_id = o.nproc_per_node * o.nnodes + i;
    kids.push_back(std::move(c));
    kids.back().pid = spawn(first, kids.back(), 0, port, master_port, attempt);
  }

  // issue 14: the watcher, a plain child (its output goes straight to ours).
  pid_t watcher = 0;
  const std::string verdict_file =
      (std::filesystem::temp_directory_path() / fmt::format("atoll-watch-verdict-{}-{}", ::getpid(), attempt)).string();
  std::filesystem::remove(verdict_file);
  bool watcher_named = false;  // the watcher named the failed rank: the exit order does not rename it
  if (!o.watch_cmd.empty()) {
    std::vector<std::string> wc = o.watch_cmd;
    // The records of an earlier start are in the same directory until the new ranks replace them.
    wc.push_back("--ignore-before-ns");
    wc.push_back(std::to_string(start_ns));
    // The ranks the watcher names come back in a file, so that the teardown and the restart line
    // name them as they name a rank that died (its exit status alone says only "a hang").
    wc.push_back("--verdict-file");
    wc.push_back(verdict_file);
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
  int exits = 0;        // ranks that have exited (their order: Child::exit_order)
  int replaced = 0;     // failed ranks whose slot a spare takes (--spares)
  // DeadPool's pool as the launcher counts it: spares started, and those still waiting for a slot.
  // Each spare that takes a slot is replaced by a new one (counted as one of --max-restarts), so
  // that a second failure is again taken over and not restarted.
  int spares_started = o.spares, spares_waiting = o.spares, refills = 0;
  clock::time_point term_at{}, kill_at{};
  bool termed = false, killed = false;
  auto last_store_check = clock::now();
  auto begin_teardown = [&](const std::string& why, bool immediate) {
    if (!failure.empty()) return;
    failure = why;
    std::fprintf(stderr, "atoll launch: %s; stopping the other ranks\n", why.c_str());
    std::fflush(stderr);
    try {
      if (!ctl.check({ctl_prefix + "failed"})) ctl.set(ctl_prefix + "failed", why);
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
          c.exit_order = exits++;
          timespec wall{};
          ::clock_gettime(CLOCK_REALTIME, &wall);
          c.exit_ns = int64_t(wall.tv_sec) * 1000000000 + wall.tv_nsec;
          if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && c.spare_id < 0 && spares_waiting > 0 && failure.empty() &&
              !g_interrupted) {
            ++replaced;
            --spares_waiting;
            std::fprintf(stderr, "atoll launch: rank %d (pid %d) %s; a spare takes its slot (DeadPool, %d of %d spares), "
                         "the job goes on\n", c.rank, int(c.pid), describe_status(st).c_str(), replaced, spares_started);
            std::fflush(stderr);
            if (restarts < o.max_restarts) {  // started after this loop: kids must not grow under it
              ++restarts;
              ++refills;
              ++spares_waiting;
            }
          } else if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && !o.restart_group && restarts < o.max_restarts &&
              failure.empty() && !g_interrupted) {
            ++restarts;
            std::fprintf(stderr, "atoll launch: %s (pid %d) %s; starting it again (restart %d of %d)\n", who_is(c).c_str(),
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
            begin_teardown(fmt::format("{} (pid {}) {}", who_is(c), c.pid, describe_status(st)), false);
          }
        }
      }
    }
    for (; refills > 0; --refills) {
      Child c;
      c.rank = c.spare_id = o.nproc_per_node * o.nnodes + spares_started++;
      std::fprintf(stderr, "atoll launch: starting spare %d to refill the pool (restart %d of %d)\n", c.rank,
                   restarts - refills + 1, o.max_restarts);
      std::fflush(stderr);
      kids.push_back(std::move(c));
      kids.back().pid = spawn(first, kids.back(), 0, port, master_port, restarts);
    }
    if (watcher > 0) {
      int st = 0;
      if (::waitpid(watcher, &st, WNOHANG) == watcher) {
        watcher = 0;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 3) {
          const std::vector<int> named = read_verdict(verdict_file);
          if (failure.empty()) {
            a.by_watcher = true;
            a.verdict = named;
          }
          std::string ranks;
          for (int r : named) ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", r);
          if (named.size() == 1 && failure.empty()) {  // a failure already under way keeps its rank
            a.failed_rank = named[0];
            watcher_named = true;
          }
          begin_teardown(named.empty() ? std::string("the watcher named a hang (its message is above)")
                                       : fmt::format("the watcher named a hang in rank{} {} (its message is above)",
                                                     named.size() == 1 ? "" : "s", ranks),
                         true);
        }
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
        if (auto f = ctl.try_get(ctl_prefix + "failed")) begin_teardown("on another node: " + *f, false);
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
  if (!failure.empty()) read_reports(a, store);
  std::filesystem::remove(verdict_file);
  if (a.failed_rank >= 0 && !watcher_named) name_culprit(a);
  return a;
}

// issue 14: the evidence a resumed run localizes a fatal fault with (train/fault_campaign_hook.h).
void write_failure_file(const Attempt& a) {
  const char* ff = std::getenv("ATOLL_FAILURE_FILE");
  if (!ff || !*ff) return;
  // Per rank, the ranks whose failure reports blamed it (the accusations of its peers' failed
  // collectives; the resumed run counts them, train/fault_campaign_hook.cpp).
  std::string lines;
  for (auto& c : a.kids) {
    std::string by;
    for (auto& [r, v] : a.reports) {
      const auto b = blamed_in(v);
      if (std::count(b.begin(), b.end(), c.rank)) by += fmt::format("{}{}", by.empty() ? "" : ", ", r);
    }
    lines += fmt::format("{{\"rank\": {}, \"status\": \"{}\", \"torn_down\": {}, \"blamed_by\": [{}], "
                         "\"reported\": {}}}\n",
                         c.rank, describe_status(c.status), c.signalled ? "true" : "false", by,
                         a.reports.count(c.rank) ? "true" : "false");
  }
  // Another node's watcher wrote its own lines into its node's file; this node's gets them here.
  if (a.verdict_node >= 0)
    for (int r : a.verdict)
      lines += fmt::format("{{\"rank\": {}, \"detector\": \"watcher\", \"status\": \"named as a hang's cause by node "
                           "{}'s watcher\"}}\n",
                           r, a.verdict_node);
  if (FILE* f = std::fopen(ff, "a")) {
    std::fputs(lines.c_str(), f);
    std::fclose(f);
  }
}

// Across nodes: what one launcher knows of a start (its ranks' ends, their failure reports, its
// watcher's verdict), posted to the control store (launch/<k>/record/<node>) so that every node's
// launcher judges the failure from the same evidence: the same rank named, the same failure file.
std::string attempt_record(const Attempt& a, int node) {
  nlohmann::json kids = nlohmann::json::array(), reports = nlohmann::json::object();
  for (auto& c : a.kids)
    kids.push_back({{"rank", c.rank}, {"pid", int(c.pid)}, {"exited", c.exited}, {"status", c.status},
                    {"signalled", c.signalled}, {"exit_ns", c.exit_ns}, {"spare_id", c.spare_id}});
  for (auto& [r, v] : a.reports) reports[std::to_string(r)] = v;
  return nlohmann::json{{"node", node},           {"failure", a.failure}, {"failed_rank", a.failed_rank},
                        {"by_watcher", a.by_watcher}, {"verdict", a.verdict}, {"kids", kids},
                        {"reports", reports}}
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The failed start as every node sees it, from every node's record (records[n]: node n's) and the
// failure posted first (first_posted). The node it began on is the one whose launcher saw it itself
// (not "on another node"), the first to post it when several did. A watcher's verdict there is the
// failure (its named rank, if one); otherwise the ranks of all nodes, ordered by when they exited,
// go through name_culprit as one node's would. Another node's watcher or other failure is quoted
// with its node. Nothing changes when a record is missing (a launcher that is gone).
void agree_on_failure(Attempt& a, const std::vector<nlohmann::json>& records, const std::string& first_posted, int me) {
  const std::string remote = "on another node: ";
  int origin = -1;
  for (int n = 0; n < int(records.size()); ++n) {
    const std::string f = records[size_t(n)].value("failure", "");
    if (f.empty() || f.rfind(remote, 0) == 0) continue;
    if (origin < 0 || (f == first_posted && records[size_t(origin)].value("failure", "") != first_posted)) origin = n;
  }
  if (origin < 0) return;
  const nlohmann::json& from = records[size_t(origin)];
  Attempt g;
  std::vector<std::pair<int64_t, size_t>> order;
  for (auto& r : records) {
    for (auto& k : r.at("kids")) {
      Child c;
      c.rank = k.at("rank").get<int>();
      c.pid = k.at("pid").get<int>();
      c.exited = k.at("exited").get<bool>();
      c.status = k.at("status").get<int>();
      c.signalled = k.at("signalled").get<bool>();
      c.exit_ns = k.at("exit_ns").get<int64_t>();
      c.spare_id = k.at("spare_id").get<int>();
      if (c.exited) order.push_back({c.exit_ns, g.kids.size()});
      g.kids.push_back(std::move(c));
    }
    for (auto& it : r.at("reports").items()) g.reports[std::stoi(it.key())] = it.value().get<std::string>();
  }
  std::sort(order.begin(), order.end());
  for (size_t i = 0; i < order.size(); ++i) g.kids[order[i].second].exit_order = int(i);
  std::string text = from.value("failure", "");
  int failed = from.value("failed_rank", -1);
  const bool by_watcher = from.value("by_watcher", false);
  if (by_watcher) {
    g.verdict = from.at("verdict").get<std::vector<int>>();
    if (origin != me) {
      g.verdict_node = origin;
      if (auto at = text.find("(its message is above)"); at != std::string::npos)
        text.replace(at, 22, fmt::format("(its message is in node {}'s output)", origin));
    }
  } else if (failed >= 0) {
    const Child* first = nullptr;
    for (auto& c : g.kids)
      if (c.exited && !(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0) && (!first || c.exit_order < first->exit_order))
        first = &c;
    if (first) {
      failed = first->rank;
      text = fmt::format("{} (pid {}) {}", who_is(*first), first->pid, describe_status(first->status));
    }
  }
  g.failure = text;
  g.failed_rank = failed;
  if (failed >= 0 && !by_watcher) name_culprit(g);
  // A rank's end reads the same on every node; a watcher's or the launcher's own words say whose.
  if (origin != me && (by_watcher || failed < 0)) g.failure = fmt::format("on node {}: {}", origin, g.failure);
  a.failure = g.failure;
  a.failed_rank = g.failed_rank;
  a.kids = std::move(g.kids);
  a.reports = std::move(g.reports);
  a.verdict = std::move(g.verdict);
  a.verdict_node = g.verdict_node;
}

}  // namespace

int launch(const LaunchOptions& o) {
  ATOLL_CHECK(!o.cmd.empty(), "atoll launch: no command given after --");
  ATOLL_CHECK(o.nproc_per_node >= 1, "--nproc-per-node must be at least 1");
  ATOLL_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes,
              "--node-rank {} is outside 0..{}", o.node_rank, o.nnodes - 1);
  ATOLL_CHECK(o.nnodes == 1 || o.rdzv_port > 0,
              "a multi-node launch needs --rdzv HOST:PORT naming node 0's address");
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

  Millis store_timeout(int64_t(1000 * std::max(60.0, o.timeout_s)));
  Millis connect_within = o.connect_timeout_s > 0 ? Millis(int64_t(o.connect_timeout_s * 1000)) : Millis(-1);
  // Several nodes: node 0 hosts, on --rdzv's port and for the job's whole life, the launchers'
  // control store. Through it they agree on each start (its rendezvous store's port, published by
  // node 0: launch/<k>/ports), tell each other a start failed (launch/<k>/failed: every node tears
  // its ranks down), and, when a start is over on every node (launch/<k>/done/<node>), all decide
  // alike from the same keys: done, or (torchrun's policy, up to --max-restarts) start again.
  std::unique_ptr<TcpStoreServer> ctl_server;
  std::unique_ptr<TcpStore> ctl;
  if (o.nnodes > 1) {
    if (o.node_rank == 0) ctl_server = std::make_unique<TcpStoreServer>("0.0.0.0", o.rdzv_port);
    ctl = std::make_unique<TcpStore>(o.rdzv_host, o.rdzv_port, store_timeout, connect_within);
    ctl->hello(o.node_rank);  // its lifeline: node 0 tells a launcher that died from a slow one
  }

  Attempt a;
  int attempt = 0;
  for (;; ++attempt) {
    // Node 0 hosts the store; a single-node job keeps it on loopback. A fresh store per start: the
    // ranks' rendezvous keys of the previous start must not meet the new ranks.
    const std::string prefix = o.nnodes > 1 ? fmt::format("launch/{}/", attempt) : "launch/";
    std::unique_ptr<TcpStoreServer> server;
    int port = o.rdzv_port;
    // MASTER_PORT stays free for rank 0's own use (torch.distributed's env:// store, say): the
    // next port on a multi-node job, so that every node agrees without asking; a free one here.
    int master_port = o.nnodes > 1 ? o.rdzv_port + 1 : pick_free_port(o.rdzv_host);
    if (o.node_rank == 0) {
      server = std::make_unique<TcpStoreServer>(o.nnodes > 1 ? "0.0.0.0" : o.rdzv_host,
                                                o.nnodes > 1 || attempt > 0 ? 0 : port);
      port = server->port();
      if (ctl) ctl->set(prefix + "ports", std::to_string(port));
    } else {
      // Node 0 publishes the start's store once its previous start is over on every node.
      std::string lost;
      try {
        for (auto v = ctl->try_get(prefix + "ports"); !g_interrupted; v = ctl->try_get(prefix + "ports")) {
          if (v) {
            port = std::stoi(*v);
            break;
          }
          std::this_thread::sleep_for(Millis(50));
        }
      } catch (const Error& e) {
        lost = std::string("lost node 0's control store: ") + e.what();
      }
      if (g_interrupted || !lost.empty()) {
        a = Attempt{};
        a.failure = lost.empty() ? fmt::format("interrupted by signal {}", int(g_interrupted)) : lost;
        a.interrupted = true;
        break;
      }
    }
    auto store = std::make_unique<TcpStore>(o.rdzv_host, port, store_timeout, connect_within);

    a = run_attempt(o, attempt, *store, ctl ? *ctl : *store, prefix, port, master_port);

    // Every node decides alike (several nodes: from the same keys of the control store).
    try {
      if (ctl) {
        // A launcher that will not start again (it was interrupted) says so before it is done,
        // so that no node starts again without it.
        if (a.interrupted || g_interrupted) ctl->set(prefix + "stop", std::to_string(o.node_rank));
        ctl->set(prefix + "record/" + std::to_string(o.node_rank), attempt_record(a, o.node_rank));
        ctl->set(prefix + "done/" + std::to_string(o.node_rank), a.failure.empty() ? "ok" : "failed");
        std::vector<std::string> keys;
        for (int n = 0; n < o.nnodes; ++n) keys.push_back(prefix + "done/" + std::to_string(n));
        // A node whose ranks are still training is waited for as long as it trains; a node whose
        // launcher is gone (its control connection closed without a goodbye) ends the job: a new
        // start would wait for its ranks in vain.
        while (!ctl->check(keys)) {
          if (g_interrupted && a.failure.empty()) {
            a.failure = fmt::format("interrupted by signal {}", int(g_interrupted));
            a.interrupted = true;
            ctl->set(prefix + "stop", std::to_string(o.node_rank));
            ctl->set(prefix + "failed", "node " + std::to_string(o.node_rank) + "'s launcher was interrupted");
          }
          std::string gone;
          for (int n : ctl->dead_ranks())
            if (!ctl->check({prefix + "done/" + std::to_string(n)})) gone += fmt::format("{}{}", gone.empty() ? "" : ", ", n);
          if (!gone.empty()) {
            const std::string why = fmt::format("the launcher of node(s) {} is gone", gone);
            if (!ctl->check({prefix + "failed"})) ctl->set(prefix + "failed", why);
            if (a.failure.empty()) a.failure = why;
            a.interrupted = true;
            break;
          }
          std::this_thread::sleep_for(Millis(100));
        }
        if (a.failure.empty())
          if (auto f = ctl->try_get(prefix + "failed")) a.failure = "on another node: " + *f;
        if (!a.failure.empty() && !a.interrupted) {
          std::vector<nlohmann::json> records;
          for (int n = 0; n < o.nnodes; ++n)
            if (auto r = ctl->try_get(prefix + "record/" + std::to_string(n))) {
              auto j = nlohmann::json::parse(*r, nullptr, false);
              if (!j.is_discarded()) records.push_back(std::move(j));
            }
          if (int(records.size()) == o.nnodes) try {
              agree_on_failure(a, records, ctl->try_get(prefix + "failed").value_or(""), o.node_rank);
            } catch (const nlohmann::json::exception&) {
              // a record of another version of atoll: this node's own view stands
            }
        }
        if (auto n = ctl->try_get(prefix + "stop"); n && !a.failure.empty() && !a.interrupted) {
          a.failure += fmt::format(" (node {}'s launcher was interrupted: no new start)", *n);
          a.interrupted = true;
        }
      } else {
        store->set("launch/done/" + std::to_string(o.node_rank), "1");
      }
    } catch (const Error& e) {
      if (a.failure.empty()) a.failure = std::string("lost node 0's control store: ") + e.what();
      a.interrupted = true;  // nobody left to agree with on a new start
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
  // Node 0 keeps the control store up until every node has read the outcome of the last start.
  if (ctl) {
    try {
      const std::string prefix = fmt::format("launch/{}/", attempt);
      ctl->set(prefix + "seen/" + std::to_string(o.node_rank), "1");
      if (ctl_server) {
        std::vector<std::string> keys;
        for (int n = 0; n < o.nnodes; ++n) keys.push_back(prefix + "seen/" + std::to_string(n));
        ctl->wait(keys, Millis(10000));
      }
    } catch (const Error&) {
    }
    try {
      ctl->goodbye();
    } catch (const Error&) {
    }
    ctl.reset();
    ctl_server.reset();
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
