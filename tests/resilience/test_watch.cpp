// The external watcher (issue 14 item 6, resilience/watcher.h, `atoll watch`): real rank processes
// over Gloo publish progress records; `atoll watch`, another process, reads them and /proc.
//  - a clean run: no alarm, every rank finished;
//  - a rank whose loader sleeps 300 ms per step: that rank, and only it, is named data starvation;
//  - a SIGSTOPped rank, and a rank blocked in a collective its peers never join: named as the
//    cause of the hang within hang_s + 2.5 s (the bound: hang_s without progress, plus a window's
//    sampling and the process start of a loaded 2-core machine), with the phase and collective.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "comm/collective_observer.h"
#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "proc.h"
#include "rank_programs.h"
#include "resilience/progress_record.h"
#include "resilience/watcher.h"

namespace atl::resilience::test {

namespace fs = std::filesystem;

namespace {

int env_int(const char* k, int def) {
  const char* v = std::getenv(k);
  return v && *v ? std::atoi(v) : def;
}

// ~ms of CPU work (not sleep: the watcher must see CPU in compute).
void burn(double ms) {
  auto t0 = std::chrono::steady_clock::now();
  volatile double x = 1;
  while (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() < ms)
    for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
}

struct Job {
  std::string dir;
  std::vector<pid_t> ranks;
  pid_t watcher = 0;
};

Job start_job(const std::string& tag, int world, const std::vector<std::string>& env, double hang_s) {
  Job j;
  j.dir = tag + ".progress";
  fs::remove_all(j.dir);
  fs::create_directories(j.dir);
  int port = comm::pick_free_port();
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> e = env;
    for (auto& x : std::vector<std::string>{"RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(world),
                                            "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(world),
                                            "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port),
                                            "OMP_NUM_THREADS=1", "WATCH_DIR=" + j.dir})
      e.push_back(x);
    j.ranks.push_back(spawn({self_exe(), "--rank-program", "watch"}, e, tag + ".log" + std::to_string(r)));
  }
  j.watcher = spawn({std::string(ATOLL_BINARY_DIR) + "/atoll", "watch", j.dir, "--ranks", std::to_string(world),
                     "--interval-ms", "100", "--window-s", "1", "--hang-s", std::to_string(hang_s),
                     "--report-every-s", "0", "--stop"},
                    {}, tag + ".watch");
  return j;
}

void cleanup(const std::string& tag, const Job& j, int world) {
  for (int r = 0; r < world; ++r) fs::remove(tag + ".log" + std::to_string(r));
  fs::remove(tag + ".watch");
  fs::remove_all(j.dir);
}

std::string tag_for(const char* what) {
  return (fs::temp_directory_path() / (std::string("atoll_watch_") + what + "_" + std::to_string(::getpid()))).string();
}

// Waits until rank `r`'s record says step >= `step`; false after timeout_s.
bool wait_step(const std::string& dir, int r, int64_t step, double timeout_s) {
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < timeout_s) {
    auto rec = read_progress(progress_path(dir, r));
    if (rec && rec->step >= step) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Lines of the watcher's log that describe rank r.
std::vector<std::string> lines_of(const std::string& log, int r) {
  std::vector<std::string> out;
  size_t pos = 0;
  const std::string key = "] rank " + std::to_string(r) + " (";
  while (pos < log.size()) {
    size_t e = log.find('\n', pos);
    std::string line = log.substr(pos, e == std::string::npos ? std::string::npos : e - pos);
    if (line.find(key) != std::string::npos) out.push_back(line);
    if (e == std::string::npos) break;
    pos = e + 1;
  }
  return out;
}

bool any_says(const std::vector<std::string>& lines, const std::string& what) {
  for (auto& l : lines)
    if (l.find(": " + what + " ") != std::string::npos || l.find(": " + what + "\n") != std::string::npos) return true;
  return false;
}

}  // namespace

// One rank of the watcher tests: WATCH_STEPS steps of data (1 ms, or WATCH_DATA_MS on
// WATCH_SLOW_RANK), 20 ms of CPU, an all-reduce; WATCH_BLOCK_RANK blocks at WATCH_BLOCK_STEP in a
// receive its peer never sends (a collective the others do not join).
int watch_rank_program() {
  auto comm = comm::make_communicator("gloo", std::chrono::milliseconds(120000));
  const int r = comm->rank(), world = comm->size();
  const char* d = std::getenv("WATCH_DIR");
  const std::string dir = d ? d : std::getenv("ATOLL_PROGRESS_DIR");  // set by `atoll launch --watch`
  auto& pub = ProgressPublisher::instance();
  pub.open(progress_path(dir, r), r, world);
  const int steps = env_int("WATCH_STEPS", 30), slow = env_int("WATCH_SLOW_RANK", -1);
  const int data_ms = env_int("WATCH_DATA_MS", 300), block = env_int("WATCH_BLOCK_RANK", -1);
  const int block_step = env_int("WATCH_BLOCK_STEP", 5);
  Tensor g = Tensor::zeros({16384}, DType::f32);
  for (int s = 1; s <= steps; ++s) {
    pub.set_step(s);
    pub.set_phase(Phase::compute);
    {
      PhaseScope d(Phase::data);
      std::this_thread::sleep_for(std::chrono::milliseconds(r == slow ? data_ms : 1));
    }
    burn(20);
    if (r == block && s == block_step) {
      Tensor x = Tensor::zeros({4}, DType::f32);
      comm->recv(x, (r + 1) % world, 7);  // never sent: blocks here
    }
    comm->all_reduce(g);
  }
  pub.close(true);
  return 0;
}

// What the trainer pays for its record: a phase change and a collective's four reports
// (started, waited on, finished, wait over), timed over many rounds; prints ns per update.
int progress_bench_main() {
  const std::string path = (fs::temp_directory_path() / ("atoll_progress_bench_" + std::to_string(::getpid()))).string();
  auto& pub = ProgressPublisher::instance();
  pub.open(path, 0, 1);
  auto* obs = comm::collective_observer();
  const std::string op = "all_reduce #1";
  const int rounds = 200000;
  std::vector<double> ns;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      pub.set_phase(i & 1 ? Phase::compute : Phase::data);
      obs->op_started(op, 4096);
      obs->wait_begin(op);
      obs->op_finished(op, true);
      obs->wait_end();
    }
    ns.push_back(std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / (rounds * 5.0));
  }
  pub.close(true);
  fs::remove(path);
  std::sort(ns.begin(), ns.end());
  std::printf("progress record: %.1f ns per update (median of 5 x %d rounds of 5 updates; min %.1f, max %.1f)\n", ns[2],
              rounds, ns[0], ns[4]);
  return 0;
}

TEST(Watcher, ACleanRunRaisesNoAlarmAndEndsWithEveryRankFinished) {
  const std::string tag = tag_for("clean");
  Job j = start_job(tag, 2, {"WATCH_STEPS=40"}, 3);
  for (size_t r = 0; r < j.ranks.size(); ++r) EXPECT_EQ(wait_for(j.ranks[r], 120), 0) << read_file(tag + ".log" + std::to_string(r));
  EXPECT_EQ(wait_for(j.watcher, 30), 0);
  const std::string log = read_file(tag + ".watch");
  EXPECT_NE(log.find("every rank finished"), std::string::npos) << log;
  EXPECT_EQ(log.find("hang:"), std::string::npos) << log;
  for (int r = 0; r < 2; ++r) {
    auto l = lines_of(log, r);
    EXPECT_FALSE(l.empty()) << log;
    for (const char* bad : {"deadlock", "stopped", "dead", "idle", "data starvation"}) EXPECT_FALSE(any_says(l, bad)) << bad << "\n" << log;
  }
  cleanup(tag, j, 2);
}

TEST(Watcher, ARankWhoseLoaderIsSlowIsNamedDataStarvationAndOnlyIt) {
  const std::string tag = tag_for("data");
  Job j = start_job(tag, 2, {"WATCH_STEPS=20", "WATCH_SLOW_RANK=1", "WATCH_DATA_MS=300"}, 3);
  for (size_t r = 0; r < j.ranks.size(); ++r) EXPECT_EQ(wait_for(j.ranks[r], 120), 0) << read_file(tag + ".log" + std::to_string(r));
  EXPECT_EQ(wait_for(j.watcher, 30), 0);
  const std::string log = read_file(tag + ".watch");
  EXPECT_TRUE(any_says(lines_of(log, 1), "data starvation")) << log;
  EXPECT_FALSE(any_says(lines_of(log, 0), "data starvation")) << log;
  // Its peer waits for it in the all-reduce: communication-bound, not a hang.
  EXPECT_TRUE(any_says(lines_of(log, 0), "communication-bound")) << log;
  EXPECT_EQ(log.find("hang:"), std::string::npos) << log;
  cleanup(tag, j, 2);
}

TEST(Watcher, ASigstoppedRankIsNamedAsTheHangsCauseWithinHangPlus2500ms) {
  const std::string tag = tag_for("stop");
  const double hang_s = 2;
  Job j = start_job(tag, 3, {"WATCH_STEPS=100000"}, hang_s);
  ASSERT_TRUE(wait_step(j.dir, 1, 5, 120)) << read_file(tag + ".log1");
  ::kill(j.ranks[1], SIGSTOP);
  auto t0 = std::chrono::steady_clock::now();
  int wrc = wait_for(j.watcher, 60);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log = read_file(tag + ".watch");
  EXPECT_EQ(wrc, 3) << log;
  EXPECT_LT(s, hang_s + 2.5) << log;
  EXPECT_NE(log.find("hang: rank(s) 1 named as the cause"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1 (pid " + std::to_string(j.ranks[1]) + ") is stopped"), std::string::npos) << log;
  // The others wait for it inside the step's all-reduce (deadlocked, or not yet hang_s into the
  // wait: they entered it up to a step after rank 1 stopped).
  for (int r : {0, 2}) {
    const std::string who = "rank " + std::to_string(r) + " (pid " + std::to_string(j.ranks[size_t(r)]) + ") ";
    EXPECT_TRUE(log.find(who + "is deadlocked in all_reduce #") != std::string::npos ||
                log.find(who + "waits in all_reduce #") != std::string::npos) << log;
  }
  for (pid_t p : j.ranks) EXPECT_EQ(wait_for(p, 20), 128 + SIGKILL);  // --stop killed the job
  cleanup(tag, j, 3);
}

TEST(Watcher, ARankBlockedInACollectiveThePeersNeverJoinIsNamedWithItsCollective) {
  const std::string tag = tag_for("block");
  const double hang_s = 2;
  Job j = start_job(tag, 3, {"WATCH_STEPS=100000", "WATCH_BLOCK_RANK=1", "WATCH_BLOCK_STEP=5"}, hang_s);
  ASSERT_TRUE(wait_step(j.dir, 1, 5, 120)) << read_file(tag + ".log1");
  auto t0 = std::chrono::steady_clock::now();  // it blocks in step 5, right after its data and compute
  int wrc = wait_for(j.watcher, 60);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log = read_file(tag + ".watch");
  EXPECT_EQ(wrc, 3) << log;
  EXPECT_LT(s, hang_s + 2.5) << log;
  EXPECT_NE(log.find("hang: rank(s) 1 named as the cause; rank 1 waits in recv from 2 #5"), std::string::npos) << log;
  for (int r : {0, 2}) EXPECT_NE(log.find("rank " + std::to_string(r) + " (pid " + std::to_string(j.ranks[size_t(r)]) +
                                          ") is deadlocked in all_reduce #5 at step 5"), std::string::npos) << log;
  for (pid_t p : j.ranks) EXPECT_EQ(wait_for(p, 20), 128 + SIGKILL);
  cleanup(tag, j, 3);
}

// `atoll launch --watch`: the launcher starts the watcher and tears the job down when it names a
// hang (here rank 1 blocked in a receive at step 5 of 2 ranks: each waits in another collective).
TEST(Watcher, AtollLaunchWatchStopsAHungJobAndSaysWhy) {
  const std::string tag = tag_for("launch");
  const std::string dir = tag + ".progress";
  fs::remove_all(dir);
  auto t0 = std::chrono::steady_clock::now();
  pid_t p = spawn({std::string(ATOLL_BINARY_DIR) + "/atoll", "launch", "--nproc-per-node", "2", "--watch",
                   "--watch-hang-s", "2", "--watch-dir", dir, "--", self_exe(), "--rank-program", "watch"},
                  {"WATCH_STEPS=100000", "WATCH_BLOCK_RANK=1", "WATCH_BLOCK_STEP=5", "OMP_NUM_THREADS=1"}, tag + ".log");
  int rc = wait_for(p, 90);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string log = read_file(tag + ".log");
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("rank 1 waits in recv from 0 #5"), std::string::npos) << log;
  // Rank 0 waits in the all-reduce, rank 1 in its receive: two ranks, two collectives, neither
  // can be singled out, so the launcher's line names both (and no failed rank).
  EXPECT_NE(log.find("the watcher named a hang in ranks 0, 1 (its message is above)"), std::string::npos) << log;
  EXPECT_LT(s, 60.0) << log;  // the job's 300 s collective timeout would be the alternative
  fs::remove(tag + ".log");
  fs::remove_all(dir);
}

// The rank the watcher names is the failed rank of the launcher's teardown and restart lines, as
// a rank that died is: 3 ranks, rank 1 blocked in a receive while 0 and 2 wait in the all-reduce.
// It hangs again after the restart, so the job ends failed, naming rank 1 both times.
TEST(Watcher, AtollLaunchWatchNamesTheHungRankInItsRestartLine) {
  const std::string tag = tag_for("launch_restart");
  const std::string dir = tag + ".progress";
  fs::remove_all(dir);
  pid_t p = spawn({std::string(ATOLL_BINARY_DIR) + "/atoll", "launch", "--nproc-per-node", "3", "--watch",
                   "--watch-hang-s", "2", "--watch-dir", dir, "--max-restarts", "1", "--", self_exe(),
                   "--rank-program", "watch"},
                  {"WATCH_STEPS=100000", "WATCH_BLOCK_RANK=1", "WATCH_BLOCK_STEP=5", "OMP_NUM_THREADS=1"}, tag + ".log");
  int rc = wait_for(p, 150);
  const std::string log = read_file(tag + ".log");
  EXPECT_EQ(rc, 1) << log;
  EXPECT_NE(log.find("restart 1 of 1, TORCHELASTIC_RESTART_COUNT=1): failed rank 1: the watcher named a hang in "
                     "rank 1 (its message is above)"), std::string::npos) << log;
  EXPECT_NE(log.find("job failed: the watcher named a hang in rank 1"), std::string::npos) << log;
  fs::remove(tag + ".log");
  fs::remove_all(dir);
}

// Across nodes the watcher's verdict reaches every launcher: two `atoll launch` on loopback, 3 ranks
// each, rank 1 (node 0) blocked in a receive while the other five wait in the all-reduce. Node 0's
// watcher names rank 1; node 1's (its ranks only wait, and its hang_s is long) says nothing. Node
// 1's launcher takes rank 1 from node 0's record in the control store: its restart line names
// failed rank 1 and whose watcher it was, and its failure file gets the watcher's line too. Before,
// node 1 said only "on another node: ..." with no failed rank, and its file had its own ranks alone.
TEST(Watcher, AcrossTwoNodesEveryLauncherNamesTheRankOneNodesWatcherNamed) {
  const std::string tag = tag_for("launch_nodes");
  const int port = comm::pick_free_port("127.0.0.1");
  std::vector<pid_t> nodes;
  for (int n = 0; n < 2; ++n) {
    fs::remove_all(tag + ".progress" + std::to_string(n));
    fs::remove(tag + ".failures" + std::to_string(n));
    nodes.push_back(spawn({std::string(ATOLL_BINARY_DIR) + "/atoll", "launch", "--nproc-per-node", "3", "--nnodes", "2",
                           "--node-rank", std::to_string(n), "--rdzv", "127.0.0.1:" + std::to_string(port), "--watch",
                           "--watch-hang-s", n == 0 ? "2" : "600", "--watch-dir", tag + ".progress" + std::to_string(n),
                           "--max-restarts", "1", "--", self_exe(), "--rank-program", "watch"},
                          {"WATCH_STEPS=100000", "WATCH_BLOCK_RANK=1", "WATCH_BLOCK_STEP=5", "OMP_NUM_THREADS=1",
                           "ATOLL_FAILURE_FILE=" + tag + ".failures" + std::to_string(n)},
                          tag + ".log" + std::to_string(n)));
  }
  EXPECT_EQ(wait_for(nodes[0], 150), 1) << read_file(tag + ".log0");
  EXPECT_EQ(wait_for(nodes[1], 60), 1) << read_file(tag + ".log1");
  const std::string log0 = read_file(tag + ".log0"), log1 = read_file(tag + ".log1");
  EXPECT_NE(log0.find("restart 1 of 1, TORCHELASTIC_RESTART_COUNT=1): failed rank 1: the watcher named a hang in "
                      "rank 1 (its message is above)"), std::string::npos) << log0;
  EXPECT_NE(log1.find("restart 1 of 1, TORCHELASTIC_RESTART_COUNT=1): failed rank 1: on node 0: the watcher named a "
                      "hang in rank 1 (its message is in node 0's output)"), std::string::npos) << log1;
  EXPECT_NE(log1.find("job failed: on node 0: the watcher named a hang in rank 1"), std::string::npos) << log1;
  // Both files: every rank's end (the six of both starts) and the watcher's line for rank 1.
  for (int n = 0; n < 2; ++n) {
    const std::string ff = read_file(tag + ".failures" + std::to_string(n));
    for (int r = 0; r < 6; ++r) EXPECT_NE(ff.find("{\"rank\": " + std::to_string(r) + ", \"status\": "), std::string::npos) << n << ": " << ff;
    EXPECT_NE(ff.find(n == 0 ? "{\"detector\":\"watcher\",\"rank\":1," : "{\"rank\": 1, \"detector\": \"watcher\""),
              std::string::npos) << n << ": " << ff;
  }
  for (int n = 0; n < 2; ++n) {
    fs::remove(tag + ".log" + std::to_string(n));
    fs::remove(tag + ".failures" + std::to_string(n));
    fs::remove_all(tag + ".progress" + std::to_string(n));
  }
}

// The judgement alone, on hand-made views.
TEST(Watcher, JudgeNamesTheCauseOnlyWhenSomeoneHangs) {
  WatchOptions o;
  o.hang_s = 2;
  auto view = [](int r, RankState st, double stalled, std::string op = "", bool in = false) {
    RankView v;
    v.rank = r;
    v.pid = 100 + r;
    v.state = st;
    v.stalled_s = stalled;
    v.op = std::move(op);
    v.in_collective = in;
    return v;
  };
  // Busy ranks and a rank stopped for less than hang_s: nothing to say yet.
  EXPECT_FALSE(judge({view(0, RankState::communication_bound, 0.5), view(1, RankState::stopped, 1.0)}, o).failure);
  // A finished rank while the others wait: the finished one is the cause (uneven data).
  auto v = judge({view(0, RankState::deadlock, 3, "all_reduce #9", true), view(1, RankState::finished, 3)}, o);
  EXPECT_TRUE(v.failure);
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  EXPECT_NE(v.message.find("finished"), std::string::npos) << v.message;
  // Everyone in the same collective: no rank can be singled out, all are named.
  v = judge({view(0, RankState::deadlock, 3, "all_reduce #9", true), view(1, RankState::deadlock, 3, "all_reduce #9", true)}, o);
  EXPECT_EQ(v.culprits, (std::vector<int>{0, 1}));
  // A stuck loader (no CPU, outside collectives) while its peers wait: it is the cause.
  v = judge({view(0, RankState::idle, 3), view(1, RankState::deadlock, 3, "all_reduce #9", true),
             view(2, RankState::deadlock, 3, "all_reduce #9", true)}, o);
  EXPECT_EQ(v.culprits, std::vector<int>{0});
  // A dead rank is a failure at once.
  v = judge({view(0, RankState::compute_bound, 0.1), view(1, RankState::dead, 0.1)}, o);
  EXPECT_TRUE(v.failure);
  EXPECT_EQ(v.culprits, std::vector<int>{1});
  // ... but not in a fault-tolerant job whose other replicas go on; there only a job where no rank
  // progresses fails.
  o.tolerant = true;
  EXPECT_FALSE(judge({view(0, RankState::compute_bound, 0.1), view(1, RankState::dead, 0.1)}, o).failure);
  EXPECT_FALSE(judge({view(0, RankState::communication_bound, 0.2), view(1, RankState::stopped, 5)}, o).failure);
  v = judge({view(0, RankState::deadlock, 3, "all_reduce #9", true), view(1, RankState::stopped, 5)}, o);
  EXPECT_TRUE(v.failure);
  EXPECT_EQ(v.culprits, std::vector<int>{1});
}

}  // namespace atl::resilience::test
