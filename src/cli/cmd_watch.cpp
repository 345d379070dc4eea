// `atoll watch DIR`: the external watcher of issue 14 (resilience/watcher.h). Reads the progress
// records the ranks publish in DIR (RUN_DIR/progress by default, or ATOLL_PROGRESS_DIR) and their
// threads' CPU time from /proc, says what each rank is doing, and turns a silent hang into a named
// failure (exit status 3), optionally killing the job's ranks (--stop).
#include <CLI/CLI.hpp>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <csignal>
#include <cstdio>
#include <map>
#include <thread>

#include "cli/command.h"
#include "cli/number_checks.h"
#include "core/error.h"
#include "resilience/watcher.h"

namespace atl::cli {
namespace {

volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

int run_watch(int argc, char** argv) {
  std::string dir, verdict_file;
  resilience::WatchOptions o;
  int64_t interval_ms = 200, ranks = 0;
  double report_every_s = 10, startup_s = 120;
  bool stop = false, quiet = false;
  CLI::App app{"Watch a running job's ranks (their progress records and CPU time) and name a hang"};
  app.add_option("dir", dir, "the directory of the progress records (RUN_DIR/progress)")->required();
  app.add_option("--interval-ms", interval_ms, "sampling period")->check(integer_in(10, 60000));
  app.add_option("--window-s", o.window_s, "phase shares and CPU rate over this window")
      ->check(CLI::Range(0.05, 3600.0));
  app.add_option("--hang-s", o.hang_s, "no progress (and no CPU) this long is a hang")->check(CLI::Range(0.1, 86400.0));
  app.add_option("--report-every-s", report_every_s, "print every rank's state this often (0: on changes only)")
      ->check(CLI::Range(0.0, 86400.0));
  app.add_option("--ranks", ranks, "wait for this many ranks' records before judging")->check(integer_in(0, 1 << 20));
  app.add_option("--startup-timeout-s", startup_s, "give up when no record appears within this")
      ->check(CLI::Range(0.1, 86400.0));
  app.add_flag("--tolerant", o.tolerant,
               "a fault-tolerant job: a dead or stopped rank is reported, and only a job where no rank progresses fails");
  app.add_option("--ignore-before-ns", o.ignore_before_ns,
                 "leave out records without progress since this CLOCK_MONOTONIC time (an earlier start's)")
      ->check(integer_in(0, std::numeric_limits<int64_t>::max()));
  app.add_flag("--quiet", quiet, "print a rank's state only in the periodic reports, not on every change");
  app.add_flag("--stop", stop, "on a hang, kill the ranks (SIGKILL) after naming it");
  app.add_option("--verdict-file", verdict_file, "on a hang, write the ranks named as its cause to this file (one line)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  ATOLL_CHECK(o.window_s <= o.hang_s, "--window-s ({}) must not exceed --hang-s ({}): a hang is judged on the "
              "CPU time of one window", o.window_s, o.hang_s);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  std::printf("watch: %s every %lld ms, window %.1f s, hang after %.1f s without progress\n", dir.c_str(),
              static_cast<long long>(interval_ms), o.window_s, o.hang_s);
  std::fflush(stdout);
  resilience::Watcher w(dir, o);
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto last_report = t0;
  std::map<int, resilience::RankState> last;
  while (!g_stop) {
    auto views = w.sample();
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - t0).count();
    if (views.empty() && since > startup_s) {
      std::fprintf(stderr, "watch: no progress record appeared in %s within %.1f s\n", dir.c_str(), startup_s);
      return 1;
    }
    const bool report = report_every_s > 0 && std::chrono::duration<double>(now - last_report).count() >= report_every_s;
    if (report) last_report = now;
    bool all_done = !views.empty() && int64_t(views.size()) >= ranks;
    for (const auto& v : views) {
      all_done = all_done && v.state == resilience::RankState::finished;
      auto it = last.find(v.rank);
      if (report || (!quiet && (it == last.end() || it->second != v.state))) std::printf("watch: [%.1f s] %s\n", since, v.describe().c_str());
      last[v.rank] = v.state;
    }
    std::fflush(stdout);
    if (all_done) {
      std::printf("watch: every rank finished\n");
      return 0;
    }
    if (int64_t(views.size()) >= ranks) {
      auto verdict = resilience::judge(views, o);
      if (verdict.failure) {
        std::printf("watch: [%.1f s] %s\n", since, verdict.message.c_str());
        std::fflush(stdout);
        std::fprintf(stderr, "atoll watch: %s\n", verdict.message.c_str());
        // issue 14: the evidence a resumed `atoll train` names the rank with (fault_campaign_hook.h).
        if (const char* ff = std::getenv("ATOLL_FAILURE_FILE"); ff && *ff && !verdict.culprits.empty()) {
          std::string lines;
          for (const auto& v : views)
            if (std::count(verdict.culprits.begin(), verdict.culprits.end(), v.rank))
              lines += nlohmann::json{{"rank", v.rank}, {"detector", "watcher"}, {"state", resilience::rank_state_name(v.state)},
                                      {"step", v.step}, {"status", v.describe()}}.dump() + "\n";
          if (FILE* f = std::fopen(ff, "a")) {
            std::fputs(lines.c_str(), f);
            std::fclose(f);
          }
        }
        if (!verdict_file.empty()) {  // for `atoll launch --watch`: the ranks it names (comm/launcher.cpp)
          std::string line;
          for (int r : verdict.culprits) line += (line.empty() ? "" : " ") + std::to_string(r);
          if (FILE* f = std::fopen(verdict_file.c_str(), "w")) {
            std::fprintf(f, "%s\n", line.c_str());
            std::fclose(f);
          }
        }
        if (stop) {
          for (const auto& v : views)
            if (v.state != resilience::RankState::dead && v.state != resilience::RankState::finished && v.pid > 0) {
              ::kill(v.pid, SIGKILL);
              std::printf("watch: killed rank %d (pid %d)\n", v.rank, v.pid);
            }
          std::fflush(stdout);
        }
        return 3;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
  }
  return 0;
}

Registrar reg({"watch", "name what each rank of a running job is doing, and a hang, from outside it", run_watch});

}  // namespace
}  // namespace atl::cli
