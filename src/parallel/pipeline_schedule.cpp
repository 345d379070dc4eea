// The schedule registry, and the simulator that checks a schedule before it runs (every action
// once, dependencies satisfiable) and predicts its bubble (pipeline_schedule.h).
#include "parallel/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

namespace atl::parallel {

const char* pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::forward: return "F";
    case PipeOp::backward: return "B";
    case PipeOp::weight: return "W";
  }
  return "?";
}

Registry<ScheduleEntry>& pipeline_schedule_registry() {
  static Registry<ScheduleEntry> r = [] {
    Registry<ScheduleEntry> g("pipeline schedule");
    g.add("gpipe", {false, false, make_gpipe});
    g.add("1f1b", {false, false, make_1f1b});
    g.add("interleaved", {true, false, make_interleaved_1f1b});
    g.add("zb-h1", {false, true, make_zb_h1});
    return g;
  }();
  return r;
}

PipeSchedule make_pipe_schedule(const std::string& name, int p, int m, int v) {
  const ScheduleEntry& e = pipeline_schedule_registry().get(name, "parallel.pp_schedule");
  ATOLL_CHECK(p >= 1 && m >= 1 && v >= 1, "pipeline schedule '{}' for pp = {}, {} micro-batches, {} chunks", name, p, m, v);
  ATOLL_CHECK(e.virtual_stages || v == 1,
              "parallel.pp_virtual = {}: schedule '{}' runs one chunk per rank; virtual stages need "
              "parallel.pp_schedule = 'interleaved'",
              v, name);
  PipeSchedule s = e.make(p, m, v);
  s.name = name;
  check_schedule(s);
  return s;
}

SimTimeline simulate(const PipeSchedule& s, double tf, double tb, double tw) {
  const int p = s.p, S = s.p * s.v;
  ATOLL_CHECK(int(s.ranks.size()) == p, "schedule '{}': {} action lists for {} ranks", s.name, s.ranks.size(), p);
  // Every action exactly once, on the rank that holds its stage.
  std::map<std::tuple<int, int, int>, int> count;  // (op, mb, stage)
  for (int r = 0; r < p; ++r)
    for (const PipeAction& a : s.ranks[size_t(r)]) {
      ATOLL_CHECK(a.mb >= 0 && a.mb < s.m && a.chunk >= 0 && a.chunk < s.v, "schedule '{}': rank {} has {}{} of chunk {}",
                  s.name, r, pipe_op_name(a.op), a.mb, a.chunk);
      ATOLL_CHECK(s.split_backward || a.op != PipeOp::weight, "schedule '{}' fuses W into B but lists W{}", s.name,
                  a.mb);
      ++count[{int(a.op), a.mb, a.chunk * p + r}];
    }
  for (int op = 0; op < (s.split_backward ? 3 : 2); ++op)
    for (int mb = 0; mb < s.m; ++mb)
      for (int st = 0; st < S; ++st) {
        int n = count.count({op, mb, st}) ? count[{op, mb, st}] : 0;
        ATOLL_CHECK(n == 1, "schedule '{}' (pp = {}, m = {}, v = {}) runs {}{} of stage {} {} times, not once", s.name,
                    p, s.m, s.v, pipe_op_name(PipeOp(op)), mb, st, n);
      }

  const double cb = s.split_backward ? tb : tb + tw;
  std::map<std::tuple<int, int, int>, double> end;  // finished actions
  std::vector<size_t> next(size_t(p), 0);
  std::vector<double> free_at(size_t(p), 0);
  SimTimeline tl;
  tl.start.resize(size_t(p));
  size_t left = 0;
  for (auto& l : s.ranks) left += l.size();
  double busy = 0;
  auto done = [&](PipeOp op, int mb, int st, double* t) {
    auto it = end.find({int(op), mb, st});
    if (it == end.end()) return false;
    *t = std::max(*t, it->second);
    return true;
  };
  while (left > 0) {
    bool progress = false;
    for (int r = 0; r < p; ++r) {
      auto& list = s.ranks[size_t(r)];
      while (next[size_t(r)] < list.size()) {
        const PipeAction& a = list[next[size_t(r)]];
        const int st = a.chunk * p + r;
        double t = free_at[size_t(r)], cost = 0;
        bool ready = true;
        if (a.op == PipeOp::forward) {
          ready = st == 0 || done(PipeOp::forward, a.mb, st - 1, &t);
          cost = tf;
        } else if (a.op == PipeOp::backward) {
          ready = done(PipeOp::forward, a.mb, st, &t) && (st == S - 1 || done(PipeOp::backward, a.mb, st + 1, &t));
          cost = cb;
        } else {
          ready = done(PipeOp::backward, a.mb, st, &t);
          cost = tw;
        }
        if (!ready) break;
        tl.start[size_t(r)].push_back(t);
        end[{int(a.op), a.mb, st}] = t + cost;
        free_at[size_t(r)] = t + cost;
        busy += cost;
        ++next[size_t(r)];
        --left;
        progress = true;
      }
    }
    if (!progress) {
      std::string stuck;
      for (int r = 0; r < p; ++r)
        if (next[size_t(r)] < s.ranks[size_t(r)].size()) {
          const PipeAction& a = s.ranks[size_t(r)][next[size_t(r)]];
          stuck += fmt::format("{}rank {} at {}{} (chunk {})", stuck.empty() ? "" : ", ", r, pipe_op_name(a.op), a.mb,
                               a.chunk);
        }
      fail("schedule '{}' (pp = {}, m = {}, v = {}) deadlocks: {} wait for each other", s.name, p, s.m, s.v, stuck);
    }
  }
  for (double f : free_at) tl.makespan = std::max(tl.makespan, f);
  tl.bubble = tl.makespan > 0 ? 1.0 - busy / (double(p) * tl.makespan) : 0;
  return tl;
}

void check_schedule(const PipeSchedule& s) { simulate(s); }

}  // namespace atl::parallel
