// Whole-job restarts of `atoll launch --max-restarts N` (torchrun's policy) around a real
// `atoll train` job: a rank that dies takes the others down with it, the group starts again with
// --resume from its last committed checkpoint, and the run ends where an uninterrupted one ends,
// bit for bit; restarts used up end the job with a clear error and every checkpoint kept.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/tcp_store.h"
#include "resilience/checkpoint_select.h"
#include "resilience/progress_record.h"
#include "train_job.h"

namespace atl::resilience::test {
namespace fs = std::filesystem;

namespace {

void expect_same_final_state(const TrainJob& job, const std::string& step_dir) {
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    const fs::path a = job.root / "run/checkpoints" / step_dir / file, b = job.root / "clean/checkpoints" / step_dir / file;
    ASSERT_TRUE(fs::exists(a) && fs::exists(b)) << a << " / " << b;
    EXPECT_EQ(read_file(a.string()), read_file(b.string())) << file;
  }
}

}  // namespace

// kill -9 of rank 1 from outside, mid-run (its own progress record says where it is).
TEST(LaunchRestart, ARankKilledMidRunRestartsTheWholeJobWhichEndsBitwiseEqualToAnUninterruptedRun) {
  TrainJob job("launch_restart");
  const std::vector<std::string> steps = {"--train.steps=40"};
  pid_t launcher = job.start(2, {"--max-restarts", "2"}, "run", steps, "a.log");
  const std::string rec = (job.root / "run/progress/rank1.progress").string();
  int victim = 0;
  int64_t at_step = 0;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(100);
       !victim && std::chrono::steady_clock::now() < until;) {
    if (auto s = read_progress(rec); s && s->pid > 0 && s->step >= 8) {
      victim = s->pid;
      at_step = s->step;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ASSERT_GT(victim, 0) << "rank 1 never reached step 8: " << job.log("a.log");
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_EQ(wait_for(launcher, 150), 0) << job.log("a.log");
  const std::string log = job.log("a.log");
  EXPECT_NE(log.find("restarting the whole job (restart 1 of 2, TORCHELASTIC_RESTART_COUNT=1): failed rank 1: "
                     "rank 1 (pid " + std::to_string(victim) + ") was killed by signal 9"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("restart 2 of 2"), std::string::npos) << log;
  // The ranks of the second start saw the count: rank 0 logged it and recorded it in the segment.
  EXPECT_NE(log.find("restart 1 of this job (TORCHELASTIC_RESTART_COUNT): resumed from"), std::string::npos) << log;
  auto segs = records_with(job.root / "run/metrics.jsonl", "segment");
  ASSERT_EQ(segs.size(), 2u) << "one segment per start";
  EXPECT_FALSE(segs[0]["segment"].contains("restart_count"));
  EXPECT_EQ(segs[1]["segment"].value("restart_count", 0), 1);
  ASSERT_TRUE(segs[1]["segment"]["resumed_from"].is_string());
  const int64_t resumed = segs[1]["segment"]["start_step"].get<int64_t>();
  EXPECT_GT(resumed, 0);
  EXPECT_LE(resumed, at_step) << "the last committed checkpoint before the kill";

  ASSERT_EQ(job.launch(2, "clean", steps, "clean.log"), 0) << job.log("clean.log");
  // The resume is exact (the same reductions in the same order on the same data from the same
  // state): the weights and optimizer state at the last step equal the uninterrupted run's.
  expect_same_final_state(job, "step_00000040");
}

// Across nodes: two `atoll launch` processes on loopback, one rank each (torchrun's --nnodes,
// --node-rank, --rdzv HOST:PORT), rank 1 (node 1) killed with -9 from outside mid-run. Both
// launchers restart the whole job together, which resumes from its last committed checkpoint and
// ends bitwise equal to an uninterrupted run of the same 2 ranks on one node.
TEST(LaunchRestart, AcrossTwoNodesAKilledRankRestartsBothNodesAndTheJobEndsBitwiseEqual) {
  TrainJob job("launch_restart_nodes");
  const int port = comm::pick_free_port("127.0.0.1");
  auto node_opts = [&](int n) {
    return std::vector<std::string>{"--nnodes", "2", "--node-rank", std::to_string(n), "--rdzv",
                                    "127.0.0.1:" + std::to_string(port), "--max-restarts", "2"};
  };
  // Each node its own failure file, as on separate hosts.
  auto failure_file = [&](int n) { return (job.root / ("failures" + std::to_string(n) + ".jsonl")).string(); };
  pid_t node1 = job.start(1, node_opts(1), "run", {}, "node1.log", {"ATOLL_FAILURE_FILE=" + failure_file(1)});
  pid_t node0 = job.start(1, node_opts(0), "run", {}, "node0.log", {"ATOLL_FAILURE_FILE=" + failure_file(0)});
  const std::string rec = (job.root / "run/progress/rank1.progress").string();
  int victim = 0;
  int64_t at_step = 0;
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(100);
       !victim && std::chrono::steady_clock::now() < until;) {
    if (auto s = read_progress(rec); s && s->pid > 0 && s->step >= 8) {
      victim = s->pid;
      at_step = s->step;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  ASSERT_GT(victim, 0) << "rank 1 never reached step 8: " << job.log("node0.log") << job.log("node1.log");
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  EXPECT_EQ(wait_for(node1, 150), 0) << job.log("node1.log");
  ASSERT_EQ(wait_for(node0, 150), 0) << job.log("node0.log");
  const std::string log0 = job.log("node0.log"), log1 = job.log("node1.log");
  // Both launchers judge from the same records (each posts its ranks' ends and reports to the
  // control store): node 0 names rank 1 with its pid and end, as node 1 does, in the same words.
  auto restart_line = [](const std::string& log) {
    const size_t at = log.find("restarting the whole job (restart 1 of 2, TORCHELASTIC_RESTART_COUNT=1): ");
    return at == std::string::npos ? std::string() : log.substr(at, log.find('\n', at) - at);
  };
  const std::string line0 = restart_line(log0), line1 = restart_line(log1);
  EXPECT_EQ(line1.find("restarting the whole job (restart 1 of 2, TORCHELASTIC_RESTART_COUNT=1): failed rank 1: "
                       "rank 1 (pid " + std::to_string(victim) + ") was killed by signal 9"),
            0u)
      << log1;
  EXPECT_EQ(line0, line1) << log0 << log1;
  // Each node's failure file holds the whole start's record, both ranks, the same lines (node 0's
  // rank 0 moved its own aside when the resumed run read it).
  auto failure_record = [&](int n) {
    if (fs::exists(failure_file(n))) return read_file(failure_file(n));
    for (auto& e : fs::directory_iterator(job.root))
      if (e.path().string().rfind(failure_file(n) + ".seen.", 0) == 0) return read_file(e.path().string());
    return std::string();
  };
  const std::string rec0 = failure_record(0), rec1 = failure_record(1);
  for (int r : {0, 1})
    EXPECT_NE(rec1.find("{\"rank\": " + std::to_string(r) + ", \"status\": "), std::string::npos) << r << ": " << rec1;
  EXPECT_NE(rec1.find("{\"rank\": 1, \"status\": \"was killed by signal 9 (SIGKILL)\", \"torn_down\": false"),
            std::string::npos)
      << rec1;
  EXPECT_EQ(rec0, rec1);
  EXPECT_EQ((log0 + log1).find("restart 2 of 2"), std::string::npos) << log0 << log1;
  auto segs = records_with(job.root / "run/metrics.jsonl", "segment");
  ASSERT_EQ(segs.size(), 2u) << "one segment per start: " << log0;
  EXPECT_EQ(segs[1]["segment"].value("restart_count", 0), 1);
  const int64_t resumed = segs[1]["segment"]["start_step"].get<int64_t>();
  EXPECT_GT(resumed, 0);
  EXPECT_LE(resumed, at_step) << "the last committed checkpoint before the kill";

  ASSERT_EQ(job.launch(2, "clean", {}, "clean.log"), 0) << job.log("clean.log");
  expect_same_final_state(job, "step_00000024");
}

// Two fatal faults of the campaign (process_termination of rank 1 at steps 8 and 13) against
// --max-restarts 1: the first is recovered inside the launch, the second uses the restarts up.
TEST(LaunchRestart, RestartsUsedUpEndTheJobWithAClearErrorAndLoseNoCheckpoint) {
  TrainJob job("launch_restart");
  std::ofstream(job.root / "campaign.json") << R"({"seed": 3, "checkpoint_every": 5, "steps": 24, "faults": [
      {"type": "process_termination", "rank": 1, "step": 8},
      {"type": "process_termination", "rank": 1, "step": 13}]})";
  const std::string camp = "--fault.campaign=" + (job.root / "campaign.json").string();
  EXPECT_NE(wait_for(job.start(2, {"--max-restarts", "1"}, "run", {camp}, "a.log"), 120), 0) << job.log("a.log");
  const std::string log = job.log("a.log");
  EXPECT_EQ(log.find("restart 1 of 1, TORCHELASTIC_RESTART_COUNT=1): failed rank 1"), log.rfind("restart 1 of 1"))
      << "one restart: " << log;
  EXPECT_NE(log.find("restart 1 of 1, TORCHELASTIC_RESTART_COUNT=1): failed rank 1"), std::string::npos) << log;
  EXPECT_NE(log.find("atoll launch: job failed: rank 1 (pid"), std::string::npos) << log;
  EXPECT_NE(log.find("gave up: every one of the 1 restart(s) allowed (--max-restarts) was used"), std::string::npos)
      << log;
  // Nothing lost: both checkpoints the two starts committed (steps 5 and 10) are there, complete
  // and verified, and a later launch goes on from the newest.
  auto cks = list_checkpoints((job.root / "run/checkpoints").string());
  ASSERT_EQ(cks.size(), 2u) << log;
  for (auto& c : cks) EXPECT_EQ(checkpoint_problem(c.path), "") << c.path;
  EXPECT_EQ(cks.back().step, 10);

  ASSERT_EQ(job.launch(2, "run", {camp, "--resume"}, "b.log"), 0) << job.log("b.log");
  EXPECT_NE(job.log("b.log").find("resumed from " + cks.back().path), std::string::npos) << job.log("b.log");
  auto rec = records_with(job.root / "run/metrics.jsonl", "campaign_score");
  ASSERT_FALSE(rec.empty()) << job.log("b.log");
  const auto& s = rec.back()["campaign_score"];
  ASSERT_EQ(s["faults"].size(), 2u) << s.dump(1);
  for (const auto& f : s["faults"]) {
    EXPECT_EQ(f["outcome"], "exact") << f.dump();
    ASSERT_FALSE(f["detected_by"].empty()) << f.dump();
    EXPECT_EQ(f["detected_by"][0], "exit status") << f.dump();
  }
  EXPECT_TRUE(s["false_positives"].empty()) << s.dump(1);
  ASSERT_EQ(job.launch(2, "clean", {}, "clean.log"), 0) << job.log("clean.log");
  expect_same_final_state(job, "step_00000024");
}

}  // namespace atl::resilience::test
