// The campaign's driver (campaign_toy.h): starts the ranks and the observer, turns exits, stopped
// heartbeats and who-waits-on-whom into detections, restarts the job after a fatal fault, scores.
#include "campaign_toy.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "comm/tcp_store.h"
#include "core/error.h"
#include "core/log.h"
#include "proc.h"
#include "resilience/checkpoint_select.h"
#include "resilience/lighthouse.h"

namespace atl::resilience::test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// A rank is "stopped" after this long without a heartbeat (they come every 100 ms): long enough
// that a loaded machine does not starve a heartbeat thread for it in a clean run.
constexpr auto kHeartbeatTimeout = std::chrono::milliseconds(1000);

namespace {

std::vector<Detection> parse_detections(const std::string& log) {
  std::vector<Detection> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("detect ", 0) != 0) continue;
    std::istringstream l(line.substr(7));
    Detection d;
    std::string verdict, ranks;
    l >> d.step >> d.detector >> verdict >> ranks;
    d.where.verdict = verdict == "outlier" ? Localization::outlier : Localization::inconclusive;
    if (ranks != "-") {
      std::stringstream rs(ranks);
      for (std::string x; std::getline(rs, x, ',');) d.where.ranks.push_back(std::stoi(x));
    }
    auto bar = line.find(" | ");
    d.detail = bar == std::string::npos ? "" : line.substr(bar + 3);
    out.push_back(d);
  }
  return out;
}

// The newest step at which every rank holds a complete, verified checkpoint (0: none).
int64_t common_checkpoint(const std::string& dir, int world) {
  std::map<int64_t, int> count;
  for (int r = 0; r < world; ++r)
    for (auto& e : list_checkpoints(fmt::format("{}/rank{}/ckpt", dir, r)))
      if (checkpoint_problem(e.path).empty()) count[e.step]++;
  int64_t best = 0;
  for (auto& [step, k] : count)
    if (k == world) best = std::max(best, step);
  return best;
}

}  // namespace

CampaignRun run_campaign(const std::string& path, int world, const std::string& dir, double timeout_s) {
  CampaignRun run;
  auto t_start = Clock::now();
  run.campaign = parse_campaign(read_file(path), world, path);
  const Campaign& c = run.campaign;
  fs::remove_all(dir);
  fs::create_directories(dir);
  int first = 0;
  int64_t start = 0;
  std::set<std::string> seen;  // detections, deduplicated across ranks
  auto add = [&](const Detection& d) {
    std::string key = fmt::format("{} {} {} {}", d.step, d.detector, verdict_name(d.where.verdict), ranks_str(d.where.ranks));
    if (seen.insert(key).second) run.detections.push_back(d);
  };
  const int max_segments = 2 + int(std::count_if(c.faults.begin(), c.faults.end(),
                                                 [](auto& f) { return fault_type(f.type).fatal; }));
  while (run.segments < max_segments) {
    const int seg = run.segments++;
    // The namespace test bed (bench/fault_campaign.sh with NETNS=1): rank r runs in namespace
    // PREFIX<r> and reaches rank 0 and the lighthouse over a bridge.
    const char* netns = std::getenv("ATOLL_CAMPAIGN_NETNS");
    const std::string master = netns ? std::getenv("ATOLL_CAMPAIGN_MASTER") : "127.0.0.1";
    LighthouseOptions lo;
    lo.host = netns ? "0.0.0.0" : "127.0.0.1";
    lo.heartbeat_timeout = kHeartbeatTimeout;
    Lighthouse lh(lo);
    const int port = comm::pick_free_port();
    std::vector<pid_t> pids;
    std::vector<std::string> logs;
    for (int r = 0; r < world; ++r) {
      logs.push_back(fmt::format("{}/seg{}.rank{}.log", dir, seg, r));
      std::vector<std::string> argv = {self_exe(), "--rank-program", "campaign"};
      std::vector<std::string> env = {"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
                                      "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(world),
                                      "MASTER_ADDR=" + master, "MASTER_PORT=" + std::to_string(port),
                                      "OMP_NUM_THREADS=1", "ATOLL_CAMPAIGN=" + path, "ATOLL_CAMPAIGN_DIR=" + dir,
                                      "ATOLL_CAMPAIGN_FIRST=" + std::to_string(first),
                                      "ATOLL_CAMPAIGN_START=" + std::to_string(start),
                                      "ATOLL_CAMPAIGN_LIGHTHOUSE=" + std::to_string(lh.port())};
      if (netns) {  // `ip netns exec` execs the rank in place: the pid and the wait status stay its own
        argv.insert(argv.begin(), {"/usr/sbin/ip", "netns", "exec", netns + std::to_string(r)});
        env.push_back(std::string("ATOLL_CAMPAIGN_LIGHTHOUSE_HOST=") + std::getenv("ATOLL_CAMPAIGN_LIGHTHOUSE_HOST"));
        env.push_back(std::string("ATOLL_CAMPAIGN_IFACE=") + std::getenv("ATOLL_CAMPAIGN_IFACE"));
      }
      pids.push_back(spawn(argv, env, logs.back()));
    }
    std::vector<int> status(static_cast<size_t>(world), -1);  // -1: running; else the wait status
    auto reap = [&] {
      for (int r = 0; r < world; ++r)
        if (status[size_t(r)] < 0) {
          int st = 0;
          if (::waitpid(pids[size_t(r)], &st, WNOHANG) == pids[size_t(r)]) status[size_t(r)] = st;
        }
    };
    auto abnormal = [&](int r) {
      int st = status[size_t(r)];
      return st >= 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    };
    bool finished = false, failed = false;
    nlohmann::json view;
    while (!finished && !failed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
      reap();
      if (std::all_of(status.begin(), status.end(), [](int st) { return st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0; })) {
        finished = true;
        break;
      }
      view = nlohmann::json::parse(lh.status());
      bool trigger = false;
      for (int r = 0; r < world; ++r) trigger = trigger || abnormal(r);
      for (auto& x : view["replicas"])
        trigger = trigger || (x["state"] == "stopped" && status[size_t(x["id"].get<int>())] < 0) ||
                  x["phase"].get<std::string>().rfind("failed", 0) == 0;
      if (std::chrono::duration<double>(Clock::now() - t_start).count() > timeout_s) {
        run.problem = "the campaign ran past its time limit";
        failed = true;
      }
      if (!trigger) continue;
      // Let whatever follows from the first failure show (the peers' timeouts, an exit): until every
      // rank has exited, stopped or failed, or 1.5 s (a rank stalled in its compute never does).
      for (auto until = Clock::now() + std::chrono::milliseconds(1500); Clock::now() < until;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        reap();
        view = nlohmann::json::parse(lh.status());
        // A rank that more than half the others blame is settled too: the vote on it is decided.
        std::vector<int> blamed(static_cast<size_t>(world), 0);
        for (auto& x : view["replicas"]) {
          std::string ph = x["phase"].get<std::string>();
          auto colon = ph.find(':');
          if (colon != std::string::npos && ph.substr(colon + 1) != "-" &&
              (ph.rfind("failed:", 0) == 0 || ph.rfind("wait:", 0) == 0)) {
            int p = std::stoi(ph.substr(colon + 1));
            if (p >= 0 && p < world) blamed[size_t(p)]++;
          }
        }
        int settled = 0;
        for (auto& x : view["replicas"]) {
          int id = x["id"].get<int>();
          std::string ph = x["phase"].get<std::string>();
          settled += status[size_t(id)] >= 0 || x["state"] != "alive" || ph.rfind("failed", 0) == 0 ||
                     ph.rfind("wait:", 0) == 0 || 2 * blamed[size_t(id)] > world;
        }
        if (settled == world && int(view["replicas"].size()) == world) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      reap();
      view = nlohmann::json::parse(lh.status());
      std::vector<int> dead, stopped;
      std::vector<std::vector<int>> accused(static_cast<size_t>(world));
      int64_t step = 0;
      bool any_failed = false;
      for (int r = 0; r < world; ++r)
        if (abnormal(r)) dead.push_back(r);
      for (auto& x : view["replicas"]) {
        int id = x["id"].get<int>();
        step = std::max(step, x["step"].get<int64_t>());
        std::string ph = x["phase"].get<std::string>();
        if (x["state"] == "stopped" && status[size_t(id)] < 0) stopped.push_back(id);
        // Whom each rank blames: the peer its receive failed on, or the one it is still waiting on
        // (a peer's timeout can take seconds longer to show, e.g. on the rank that hosts the store).
        if (ph.rfind("failed:", 0) == 0) any_failed = true;
        if (ph.rfind("failed:", 0) == 0 && ph != "failed:-") accused[size_t(id)].push_back(std::stoi(ph.substr(7)));
        if (ph.rfind("wait:", 0) == 0) accused[size_t(id)].push_back(std::stoi(ph.substr(5)));
      }
      std::sort(stopped.begin(), stopped.end());
      Detection d;
      d.step = step;
      if (!dead.empty()) {
        d.detector = "exit-status";
        d.where = evidence(dead);
        for (int r : dead) {
          int st = status[size_t(r)];
          d.detail += fmt::format("rank {} {}; ", r,
                                  WIFSIGNALED(st) ? fmt::format("killed by signal {}", WTERMSIG(st))
                                                  : fmt::format("exited with {}", WEXITSTATUS(st)));
        }
      } else if (!stopped.empty()) {
        d.detector = "observer";
        d.where = evidence(stopped);
        d.detail = "heartbeats stopped, connection open";
      } else {
        d.detector = "comm-timeouts";
        d.where = localize_by_accusations(accused);
        if (d.where.verdict == Localization::clean && any_failed) d.where.verdict = Localization::inconclusive;
        d.detail = "who waited on whom:";
        for (auto& x : view["replicas"])
          d.detail += fmt::format(" {}={}", x["id"].get<int>(), x["phase"].get<std::string>());
      }
      add(d);
      failed = true;
      // The fault that ended this segment: the first fatal one scheduled up to here.
      int next = first;
      for (auto& f : c.faults)
        if (f.index >= first && f.step <= step && fault_type(f.type).fatal) {
          next = f.index + 1;
          break;
        }
      if (next == first) run.problem = fmt::format("segment {} failed at step {} with no fatal fault scheduled", seg, step);
      first = next;
    }
    for (int r = 0; r < world; ++r)
      if (status[size_t(r)] < 0) {
        ::kill(pids[size_t(r)], SIGKILL);
        ::waitpid(pids[size_t(r)], nullptr, 0);
      }
    for (auto& l : logs)
      for (auto& d : parse_detections(read_file(l))) add(d);
    if (finished) {
      run.completed = true;
      break;
    }
    if (!run.problem.empty()) break;
    start = common_checkpoint(dir, world);
  }
  if (!run.completed && run.problem.empty()) run.problem = "too many restarts";
  std::sort(run.detections.begin(), run.detections.end(),
            [](const Detection& a, const Detection& b) { return a.step < b.step; });
  run.score = score_campaign(c, run.detections);
  run.seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  return run;
}

int campaign_main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_resilience --campaign FILE WORLD [WORKDIR]\n");
    return 2;
  }
  try {
    std::string dir = argc >= 3 ? argv[2] : (fs::temp_directory_path() / ("atoll_campaign_" + std::to_string(::getpid()))).string();
    CampaignRun run = run_campaign(argv[0], std::atoi(argv[1]), dir, 600);
    std::printf("%s", format_score(run.campaign, run.score).c_str());
    std::printf("detections:\n");
    for (auto& d : run.detections)
      std::printf("  step %lld %s %s %s: %s\n", static_cast<long long>(d.step), d.detector.c_str(),
                  verdict_name(d.where.verdict), ranks_str(d.where.ranks).c_str(), d.detail.c_str());
    std::printf("%d segment(s) (%d restart(s)), %.1f s, %s\n", run.segments, run.segments - 1, run.seconds,
                run.completed ? "completed" : ("NOT completed: " + run.problem).c_str());
    return run.completed ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "campaign failed: %s\n", e.what());
    return 1;
  }
}

}  // namespace atl::resilience::test
