#include "resilience/watcher.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace atl::resilience {

namespace fs = std::filesystem;

const char* rank_state_name(RankState s) {
  switch (s) {
    case RankState::starting: return "starting";
    case RankState::compute_bound: return "compute-bound";
    case RankState::communication_bound: return "communication-bound";
    case RankState::data_starvation: return "data starvation";
    case RankState::checkpoint: return "checkpoint";
    case RankState::eval: return "eval";
    case RankState::idle: return "idle";
    case RankState::deadlock: return "deadlock";
    case RankState::stopped: return "stopped";
    case RankState::dead: return "dead";
    case RankState::finished: return "finished";
  }
  return "?";
}

std::string progress_path(const std::string& dir, int rank) {
  return (fs::path(dir) / ("rank" + std::to_string(rank) + ".progress")).string();
}

namespace {

// /proc/<pid>[/task/<tid>]/stat: "pid (comm) S ppid ... utime stime ..."; comm may hold spaces and
// parentheses, so the fields are counted from the last ')'. Returns false when unreadable.
bool read_stat(const std::string& path, char& state, double& cpu_s) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line)) return false;
  auto close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream in(line.substr(close + 1));
  std::vector<std::string> fld;
  for (std::string x; in >> x;) fld.push_back(x);
  if (fld.size() < 13) return false;
  state = fld[0].empty() ? '?' : fld[0][0];
  static const double tick = double(::sysconf(_SC_CLK_TCK));
  cpu_s = (std::stod(fld[11]) + std::stod(fld[12])) / tick;  // utime, stime
  return true;
}

RankState busy_state(Phase p) {
  switch (p) {
    case Phase::compute: return RankState::compute_bound;
    case Phase::collective: return RankState::communication_bound;
    case Phase::data: return RankState::data_starvation;
    case Phase::checkpoint: return RankState::checkpoint;
    case Phase::eval: return RankState::eval;
    case Phase::idle: return RankState::idle;
    case Phase::done: return RankState::finished;
    case Phase::startup: return RankState::starting;
  }
  return RankState::starting;
}

std::string ranks_list(const std::vector<int>& r) {
  std::string s;
  for (size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + std::to_string(r[i]);
  return s;
}

}  // namespace

ProcSample sample_process(int pid) {
  ProcSample out;
  const std::string base = "/proc/" + std::to_string(pid);
  double cpu = 0;
  if (pid <= 0 || !read_stat(base + "/stat", out.state, cpu)) {
    out.state = 0;
    return out;
  }
  std::error_code ec;
  for (const auto& t : fs::directory_iterator(base + "/task", ec)) {
    char st = 0;
    double c = 0;
    if (!read_stat((t.path() / "stat").string(), st, c)) continue;  // a thread that just ended
    out.cpu_s += c;
    out.top_thread_cpu_s = std::max(out.top_thread_cpu_s, c);
    ++out.threads;
  }
  if (out.threads == 0) out.cpu_s = cpu;
  return out;
}

std::string RankView::describe() const {
  std::string s = fmt::format("rank {} (pid {}) step {}: {}", rank, pid, step, rank_state_name(state));
  if (state == RankState::dead || state == RankState::finished) return s;
  s += fmt::format(" — phase {}", phase_name(phase));
  if (!op.empty()) s += fmt::format(", {} {}", in_collective ? "in" : "last collective", op);
  s += fmt::format(", cpu {:.2f} cores, last progress {:.1f} s ago; window:", cpu, stalled_s);
  for (int p = 0; p < kPhases; ++p)
    if (share[size_t(p)] >= 0.01) s += fmt::format(" {} {:.0f}%", phase_name(Phase(p)), 100 * share[size_t(p)]);
  return s;
}

Watcher::Watcher(std::string dir, WatchOptions o) : dir_(std::move(dir)), o_(o) {}

std::vector<RankView> Watcher::sample() {
  std::vector<RankView> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("rank", 0) != 0 || e.path().extension() != ".progress") continue;
    auto rec = read_progress(e.path().string());
    if (!rec || rec->last_event_ns < o_.ignore_before_ns) continue;
    ProcSample ps = sample_process(rec->pid);
    RankView v;
    v.rank = rec->rank;
    v.pid = rec->pid;
    v.step = rec->step;
    v.phase = rec->phase;
    v.in_collective = rec->in_collective();
    v.op = rec->waiting > 0 ? rec->wait_op : rec->last_op;
    v.stalled_s = double(rec->now_ns - rec->last_event_ns) / 1e9;
    auto& h = history_[name + ":" + std::to_string(rec->pid)];  // a new run's record starts afresh
    h.push_back({rec->now_ns, ps.cpu_s, rec->phase_ns});
    const int64_t window_ns = int64_t(o_.window_s * 1e9);
    while (h.size() > 2 && h[1].t_ns <= rec->now_ns - window_ns) h.pop_front();
    const Point& a = h.front();
    const double dt = double(rec->now_ns - a.t_ns) / 1e9;
    if (dt > 0) {
      v.cpu = std::max(0.0, ps.cpu_s - a.cpu_s) / dt;
      int64_t total = 0;
      for (int p = 0; p < kPhases; ++p) total += rec->phase_ns[size_t(p)] - a.phase_ns[size_t(p)];
      for (int p = 0; p < kPhases && total > 0; ++p)
        v.share[size_t(p)] = double(rec->phase_ns[size_t(p)] - a.phase_ns[size_t(p)]) / double(total);
    }
    if (rec->phase == Phase::done) {
      v.state = RankState::finished;
    } else if (ps.state == 0 || ps.state == 'Z' || ps.state == 'X') {
      v.state = RankState::dead;
    } else if (ps.state == 'T' || ps.state == 't') {
      v.state = RankState::stopped;
    } else if (dt < o_.window_s / 2) {  // too little history for shares or a CPU rate
      v.state = RankState::starting;
    } else if (v.stalled_s >= o_.hang_s && v.cpu < o_.idle_cpu) {
      v.state = v.in_collective ? RankState::deadlock : RankState::idle;
    } else {
      int best = int(Phase::startup);
      for (int p = 0; p < kPhases; ++p)
        if (v.share[size_t(p)] > v.share[size_t(best)]) best = p;
      v.state = busy_state(Phase(best));
    }
    out.push_back(std::move(v));
  }
  std::sort(out.begin(), out.end(), [](const RankView& x, const RankView& y) { return x.rank < y.rank; });
  return out;
}

Verdict judge(const std::vector<RankView>& views, const WatchOptions& o) {
  Verdict v;
  std::vector<const RankView*> stopped, dead, deadlocked, idle, finished, busy_stalled;
  for (const auto& r : views) {
    if (r.state == RankState::stopped && r.stalled_s >= o.hang_s) stopped.push_back(&r);
    if (r.state == RankState::dead) dead.push_back(&r);
    if (r.state == RankState::deadlock) deadlocked.push_back(&r);
    if (r.state == RankState::idle && r.stalled_s >= o.hang_s) idle.push_back(&r);
    if (r.state == RankState::finished) finished.push_back(&r);
    if (r.stalled_s >= o.hang_s && r.cpu >= o.idle_cpu && r.state != RankState::stopped &&
        r.state != RankState::dead && r.state != RankState::finished)
      busy_stalled.push_back(&r);
  }
  // A hang is the job's: no live rank progressed for hang_s (so that the verdict sees where every
  // rank ended up, not the first one to stop), with one stopped or deadlocked. A death is a failure
  // at once, except in a fault-tolerant job, whose replicas go on without it.
  bool someone_progresses = false;
  for (const auto& r : views)
    someone_progresses = someone_progresses || (r.state != RankState::dead && r.state != RankState::stopped &&
                                                r.state != RankState::finished && r.stalled_s < o.hang_s);
  v.failure = (!o.tolerant && !dead.empty()) || ((!stopped.empty() || !deadlocked.empty()) && !someone_progresses);
  if (!v.failure) return v;
  std::vector<std::string> why;
  auto name = [&](const RankView* r, std::string clause) {
    v.culprits.push_back(r->rank);
    why.push_back(std::move(clause));
  };
  for (auto* r : stopped)
    name(r, fmt::format("rank {} (pid {}) is stopped (process state T: SIGSTOP or a debugger) at step {} in phase {}{}, "
                        "no progress for {:.1f} s",
                        r->rank, r->pid, r->step, phase_name(r->phase),
                        r->op.empty() ? "" : fmt::format(" ({} {})", r->in_collective ? "in" : "after", r->op),
                        r->stalled_s));
  for (auto* r : dead)
    name(r, fmt::format("rank {} (pid {}) is dead (its process is gone without finishing) after step {}, phase {}",
                        r->rank, r->pid, r->step, phase_name(r->phase)));
  if (!deadlocked.empty()) {
    for (auto* r : idle)
      name(r, fmt::format("rank {} (pid {}) is stuck outside any collective, in phase {} at step {}, with no CPU "
                          "and no progress for {:.1f} s",
                          r->rank, r->pid, phase_name(r->phase), r->step, r->stalled_s));
    for (auto* r : busy_stalled)
      name(r, fmt::format("rank {} (pid {}) is busy ({:.2f} cores) in phase {} at step {} without progress for {:.1f} s",
                          r->rank, r->pid, r->cpu, phase_name(r->phase), r->step, r->stalled_s));
    for (auto* r : finished)
      name(r, fmt::format("rank {} has finished (at step {}) while others wait for it: data that ran out unevenly?",
                          r->rank, r->step));
  }
  if (v.culprits.empty() && !deadlocked.empty()) {
    // Every rank waits: if they wait in different collectives, the ones outside the largest group
    // are the ones that went another way (a collective desync); otherwise none can be singled out.
    std::map<std::string, std::vector<int>> by_op;  // every rank inside a collective, by which one
    for (const auto& r : views)
      if (r.in_collective && r.state != RankState::dead && r.state != RankState::finished) by_op[r.op].push_back(r.rank);
    size_t most = 0;
    for (auto& [op, rs] : by_op) most = std::max(most, rs.size());
    size_t at_most = 0;
    for (auto& [op, rs] : by_op) at_most += rs.size() == most;
    for (auto* r : deadlocked)
      if (by_op.size() > 1 && by_op.count(r->op) && (by_op[r->op].size() < most || at_most > 1))
        name(r, fmt::format("rank {} waits in {} while {} wait in other collectives (the ranks went different ways)",
                            r->rank, r->op, by_op.size() == 2 ? "the others" : "others"));
    if (v.culprits.empty())
      for (auto* r : deadlocked) v.culprits.push_back(r->rank);
  }
  // Where every other rank is: the deadlocked ones, and those not yet hang_s into their wait.
  std::vector<std::string> rest;
  for (const auto& r : views) {
    if (std::find(v.culprits.begin(), v.culprits.end(), r.rank) != v.culprits.end() && r.state != RankState::deadlock)
      continue;
    if (r.state == RankState::deadlock)
      rest.push_back(fmt::format("rank {} (pid {}) is deadlocked in {} at step {} (no CPU, no progress for {:.1f} s)",
                                 r.rank, r.pid, r.op.empty() ? "a collective" : r.op, r.step, r.stalled_s));
    else if (r.in_collective && r.state != RankState::dead && r.state != RankState::finished)
      rest.push_back(fmt::format("rank {} (pid {}) waits in {} at step {} (no progress for {:.1f} s)", r.rank, r.pid,
                                 r.op, r.step, r.stalled_s));
    else if (r.state != RankState::dead && r.state != RankState::stopped)
      rest.push_back(fmt::format("rank {} (pid {}) is {} at step {} in phase {}", r.rank, r.pid, rank_state_name(r.state),
                                 r.step, phase_name(r.phase)));
  }
  std::sort(v.culprits.begin(), v.culprits.end());
  v.culprits.erase(std::unique(v.culprits.begin(), v.culprits.end()), v.culprits.end());
  v.message = fmt::format("hang: rank(s) {} named as the cause", ranks_list(v.culprits));
  for (auto& w : why) v.message += "; " + w;
  for (auto& w : rest) v.message += "; " + w;
  return v;
}

}  // namespace atl::resilience
