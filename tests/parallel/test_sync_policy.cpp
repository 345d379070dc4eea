// Sync policies for the DiLoCo family (src/lowcomm/sync_controller.h) and serving-load traces
// (load_trace.h), decided step by step on known traces: fixed is DiLoCo's every-H schedule;
// workload_aware defers during a burst and syncs once it passes, and is forced by its deferral
// bound; matched_random spends exactly its budget, at windows that change with the seed; a
// malformed trace file is refused with its line. End to end over 2 islands: test_islands.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "lowcomm/sync_controller.h"

using namespace atl;
using namespace atl::lowcomm;
namespace fs = std::filesystem;

namespace {

fs::path temp(const std::string& name) { return fs::temp_directory_path() / (name + "_" + std::to_string(getpid())); }

fs::path write_trace(const std::string& name, const std::vector<double>& v) {
  fs::path p = temp(name);
  LoadTrace(v).write(p.string());
  return p;
}

std::vector<int64_t> sync_steps(SyncController& s, int64_t steps) {
  std::vector<int64_t> out;
  for (int64_t t = 0; t < steps; ++t)
    if (s.should_sync(t)) out.push_back(t);
  return out;
}

// Quiet (0.1) for steps 0-9, a burst (0.95) for steps 10-15, quiet after.
std::vector<double> one_burst() {
  std::vector<double> v(30, 0.1);
  for (int t = 10; t < 16; ++t) v[size_t(t)] = 0.95;
  return v;
}

}  // namespace

TEST(SyncPolicy, FixedIsEveryInnerSteps) {
  SyncPolicyConfig c;
  c.period = 3;
  auto s = make_sync_controller(c);
  EXPECT_EQ(sync_steps(*s, 10), (std::vector<int64_t>{2, 5, 8}));
  EXPECT_EQ(s->syncs(), 3);
}

// H = 4, threshold 1, load weight 1: in quiet time the score since/4 - 0.1 reaches 1 at 5 steps
// since the last sync (steps 4 and 9). In the burst (steps 10-15) it stays below 1 (6/4 - 0.95);
// at step 16 the load drops and the EWMA is falling, so the forecast adds no pressure: a sync.
// A fixed H = 5 would sync at step 14, inside the burst.
TEST(SyncPolicy, WorkloadAwareDefersDuringABurstAndSyncsOnceItPasses) {
  SyncPolicyConfig c;
  c.policy = "workload_aware";
  c.period = 4;
  c.max_defer = 100;
  c.trace = write_trace("wa_burst", one_burst()).string();
  auto s = make_sync_controller(c);
  auto at = sync_steps(*s, 20);
  EXPECT_EQ(at, (std::vector<int64_t>{4, 9, 16}));
  for (int64_t t : at) EXPECT_FALSE(t >= 10 && t < 16) << "synced in the burst at step " << t;
  // The bound: with max_defer = 3 the burst cannot hold a sync off longer than 3 steps.
  c.max_defer = 3;
  auto b = make_sync_controller(c);
  auto forced = sync_steps(*b, 20);
  bool in_burst = false;
  for (size_t i = 0; i < forced.size(); ++i) {
    EXPECT_LE(forced[i] - (i ? forced[i - 1] : -1), 3) << "deferred past the bound at step " << forced[i];
    in_burst = in_burst || (forced[i] >= 10 && forced[i] < 16);
  }
  EXPECT_TRUE(in_burst) << "max_defer = 3 must force a sync inside a 6-step burst";
  fs::remove(c.trace);
}

// A resumed run's first call replays the steps before it: the same decisions as one that ran.
TEST(SyncPolicy, AResumedControllerDecidesAsOneThatRan) {
  SyncPolicyConfig c;
  c.policy = "workload_aware";
  c.period = 4;
  c.max_defer = 100;
  c.trace = write_trace("wa_resume", one_burst()).string();
  auto full = make_sync_controller(c);
  auto at = sync_steps(*full, 20);
  auto cut = make_sync_controller(c);
  std::vector<int64_t> after;
  for (int64_t t = 12; t < 20; ++t)
    if (cut->should_sync(t)) after.push_back(t);
  std::vector<int64_t> want;
  for (int64_t t : at)
    if (t >= 12) want.push_back(t);
  EXPECT_EQ(after, want);
  EXPECT_EQ(cut->syncs(), full->syncs());
  fs::remove(c.trace);
}

TEST(SyncPolicy, MatchedRandomSpendsExactlyItsBudgetAtSeededWindows) {
  SyncPolicyConfig c;
  c.policy = "matched_random";
  c.total_steps = 60;
  c.budget = 7;
  std::vector<std::vector<int64_t>> by_seed;
  for (int64_t seed : {1, 2, 1}) {
    c.seed = seed;
    auto s = make_sync_controller(c);
    auto at = sync_steps(*s, 60);
    EXPECT_EQ(at.size(), 7u) << "seed " << seed;
    by_seed.push_back(at);
  }
  EXPECT_NE(by_seed[0], by_seed[1]) << "seeds 1 and 2 chose the same windows";
  EXPECT_EQ(by_seed[0], by_seed[2]) << "the same seed must choose the same windows (every rank decides alone)";
  c.budget = 60;  // every step
  EXPECT_EQ(sync_steps(*make_sync_controller(c), 60).size(), 60u);
}

TEST(LoadTrace, BurstyIsSeededBoundedAndBursty) {
  BurstyTraceParams p;
  auto a = LoadTrace::bursty(2000, p), b = LoadTrace::bursty(2000, p);
  p.seed = 2;
  auto c = LoadTrace::bursty(2000, p);
  EXPECT_EQ(a.values(), b.values());
  EXPECT_NE(a.values(), c.values());
  int high = 0;
  for (double x : a.values()) {
    EXPECT_GE(x, 0.0);
    EXPECT_LE(x, 1.0);
    high += x > p.base + p.burst_scale * 0.9;
  }
  // Bursts start with p 0.05 and last 4 steps on average: about 1 step in 6 is in a burst.
  EXPECT_GT(high, 100);
  EXPECT_LT(high, 1000);
  EXPECT_EQ(a.at(2000), a.at(0));  // wraps
}

TEST(LoadTrace, ReadsLinesAndCsvAndRefusesAMalformedLineByNumber) {
  fs::path p = temp("trace_ok.csv");
  std::ofstream(p) << "step,load\n# a comment\n0,0.25\n1, 0.5\n\n2,1.5\n";
  auto t = LoadTrace::read(p.string());
  EXPECT_EQ(t.values(), (std::vector<double>{0.25, 0.5, 1.5}));
  fs::path bad = temp("trace_bad.txt");
  std::ofstream(bad) << "0.1\n0.2\nbusy\n0.3\n";
  try {
    LoadTrace::read(bad.string());
    ADD_FAILURE() << "a malformed trace was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(bad.string() + ":3: 'busy' is not a number"), std::string::npos) << e.what();
  }
  std::ofstream(bad) << "0.1\n-0.2\n";
  EXPECT_THROW(LoadTrace::read(bad.string()), std::exception);
  fs::remove(p);
  fs::remove(bad);
}
