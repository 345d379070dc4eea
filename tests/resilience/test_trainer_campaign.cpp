// The fault-injection campaign inside a real `atoll train` job started by `atoll launch`
// (train/fault_campaign_hook.h): faults of each of the catalog's 5 families on 2 ranks, the
// detection and the repair recorded in metrics.jsonl, and the run ending bitwise equal to a clean
// run of the same config (every repair restores the exact trajectory: the broadcast before the
// step, the checkpoint written again, the resume from a checkpoint).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "train_job.h"

namespace atl::resilience::test {
namespace fs = std::filesystem;
namespace {

nlohmann::json last_record(const fs::path& metrics, const std::string& field) {
  auto all = records_with(metrics, field);
  return all.empty() ? nlohmann::json() : all.back();
}

}  // namespace

TEST(TrainerCampaign, FaultsOfEveryFamilyAreDetectedRepairedAndTheRunEndsBitwiseEqualToACleanOne) {
  TrainJob job("train_campaign");
  {
    std::ofstream f(job.root / "campaign.json");
    f << R"({"seed": 7, "checkpoint_every": 5, "steps": 24, "faults": [
      {"type": "tensor_corruption", "rank": 1, "step": 7},
      {"type": "delay", "rank": 0, "step": 9},
      {"type": "checkpoint_corruption", "rank": 0, "step": 12},
      {"type": "collective_desync", "rank": 1, "step": 14},
      {"type": "checkpoint_truncation", "rank": 0, "step": 16},
      {"type": "process_termination", "rank": 1, "step": 17},
      {"type": "checkpoint_missing", "rank": 0, "step": 21}]})";
  }
  const std::string camp = "--fault.campaign=" + (job.root / "campaign.json").string();
  // The first launch ends with the SIGKILL of rank 1 at step 17; resumed, the job finishes.
  EXPECT_NE(job.launch(2, "run", {camp}, "a.log"), 0) << job.log("a.log");
  ASSERT_TRUE(fs::exists(job.root / "failures.jsonl")) << job.log("a.log");
  ASSERT_EQ(job.launch(2, "run", {camp, "--resume"}, "b.log"), 0) << job.log("b.log");
  ASSERT_EQ(job.launch(2, "clean", {}, "clean.log"), 0) << job.log("clean.log");

  nlohmann::json rec = last_record(job.root / "run/metrics.jsonl", "campaign_score");
  ASSERT_FALSE(rec.is_null()) << job.log("b.log");
  const auto& s = rec["campaign_score"];
  // 2 ranks: the votes (timing, phase fingerprints) have no strict majority and name nobody; the
  // evidence about one rank (its own parameters, the writer's checkpoint, an exit status) names it.
  std::map<std::string, std::pair<std::string, std::string>> want = {
      {"tensor_corruption", {"exact", "state self-check"}},
      {"delay", {"inconclusive", "boundary timing"}},
      {"checkpoint_corruption", {"exact", "checkpoint scrub"}},
      {"collective_desync", {"inconclusive", "phase fingerprints"}},
      {"checkpoint_truncation", {"exact", "checkpoint scrub"}},
      {"process_termination", {"exact", "exit status"}},
      {"checkpoint_missing", {"exact", "checkpoint scrub"}}};
  ASSERT_EQ(s["faults"].size(), want.size()) << s.dump(1);
  for (const auto& f : s["faults"]) {
    const std::string type = f["type"];
    SCOPED_TRACE(type);
    EXPECT_TRUE(f["fired"].get<bool>());
    EXPECT_TRUE(f["detected"].get<bool>());
    EXPECT_EQ(f["outcome"], want[type].first) << f.dump();
    ASSERT_FALSE(f["detected_by"].empty());
    EXPECT_EQ(f["detected_by"][0], want[type].second) << f.dump();
    ASSERT_FALSE(f["recovery"].empty());
  }
  EXPECT_EQ(s["wrong"], 0);
  EXPECT_EQ(s["missed"], 0);
  EXPECT_TRUE(s["false_positives"].empty()) << s.dump(1);
  // Recovered: the corrupted weight was put back before its step ran, the corrupted checkpoint
  // replaced, the killed job resumed: the weights and the optimizer state of the last step are
  // the clean run's, bit for bit (the same reductions in the same order on the same data).
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    EXPECT_EQ(read_file((job.root / "run/checkpoints/step_00000024" / file).string()),
              read_file((job.root / "clean/checkpoints/step_00000024" / file).string()))
        << file;
  }
  // Each detection is also in the record of the step it was made at.
  nlohmann::json at7 = last_record(job.root / "run/metrics.jsonl", "campaign");
  EXPECT_FALSE(at7.is_null());
}

TEST(TrainerCampaign, ATypeTheTrainerCannotFireIsRefusedNamingTheFault) {
  TrainJob job("train_campaign");
  std::ofstream(job.root / "campaign.json") << R"({"seed": 1, "checkpoint_every": 5, "steps": 24,
      "faults": [{"type": "resource_unavailable", "rank": 1, "step": 3}]})";
  EXPECT_NE(job.launch(2, "run", {"--fault.campaign=" + (job.root / "campaign.json").string()}, "a.log"), 0);
  const std::string log = job.log("a.log");
  EXPECT_NE(log.find("fault 0 (resource_unavailable) is not fired inside atoll train"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(job.root / "run/metrics.jsonl")) << "refused before step 1";
}

// The faults repaired in place, without a restart: a rank's state put back 3 steps (stale_state),
// a flipped bit in a gradient bucket on its way out (payload_corruption), a learning rate that
// drifted on one rank (config_drift), a checkpoint write that fails (checkpoint_io_error), and a
// gradient message that never lands (message_drop).
TEST(TrainerCampaign, StateConfigPayloadAndCheckpointWriteFaultsAreRepairedInPlaceBitwise) {
  TrainJob job("train_campaign");
  std::ofstream(job.root / "campaign.json") << R"({"seed": 5, "checkpoint_every": 5, "steps": 24, "faults": [
      {"type": "stale_state", "rank": 1, "step": 6},
      {"type": "payload_corruption", "rank": 0, "step": 9},
      {"type": "config_drift", "rank": 1, "step": 12},
      {"type": "checkpoint_io_error", "rank": 0, "step": 15},
      {"type": "payload_corruption", "rank": 1, "step": 18},
      {"type": "message_drop", "rank": 1, "step": 21}]})";
  ASSERT_EQ(job.launch(2, "run", {"--fault.campaign=" + (job.root / "campaign.json").string()}, "a.log"), 0)
      << job.log("a.log");
  ASSERT_EQ(job.launch(2, "clean", {}, "clean.log"), 0) << job.log("clean.log");
  nlohmann::json rec = last_record(job.root / "run/metrics.jsonl", "campaign_score");
  ASSERT_FALSE(rec.is_null()) << job.log("a.log");
  const auto& s = rec["campaign_score"];
  // Evidence about one rank names it at 2 ranks: its own parameters' hash, the sender whose re-sent
  // payload fails its CRC, the writer's failed save. The config hash is a vote: 2 ranks that
  // disagree have no strict majority, so it names nobody, and both return to the launch config.
  std::map<std::string, std::pair<std::string, std::string>> want = {
      {"stale_state", {"exact", "state self-check"}},
      {"payload_corruption", {"exact", "gradient checksum"}},
      {"config_drift", {"inconclusive", "config hash"}},
      {"checkpoint_io_error", {"exact", "checkpoint write"}},
      {"message_drop", {"exact", "gradient checksum"}}};
  ASSERT_EQ(s["faults"].size(), 6u) << s.dump(1);
  for (const auto& f : s["faults"]) {
    const std::string type = f["type"];
    SCOPED_TRACE(type);
    EXPECT_TRUE(f["fired"].get<bool>());
    EXPECT_EQ(f["outcome"], want[type].first) << f.dump();
    ASSERT_EQ(f["detected_by"].size(), 1u) << f.dump();
    EXPECT_EQ(f["detected_by"][0], want[type].second) << f.dump();
  }
  // The dropped message is told from a corrupted one: its re-sent copy never arrived.
  bool drop_named = false;
  for (const auto& d : records_with(job.root / "run/metrics.jsonl", "campaign"))
    for (const auto& det : d["campaign"])
      drop_named = drop_named || (det["step"] == 21 && det["detail"].get<std::string>().find(
                                                           "never arrived (its slot stayed empty): a dropped message") !=
                                                           std::string::npos);
  EXPECT_TRUE(drop_named) << job.log("a.log");
  EXPECT_TRUE(s["false_positives"].empty()) << s.dump(1);
  // Every repair ran before the fault could reach the trajectory: the last state is the clean run's.
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    EXPECT_EQ(read_file((job.root / "run/checkpoints/step_00000024" / file).string()),
              read_file((job.root / "clean/checkpoints/step_00000024" / file).string()))
        << file;
  }
}

// At 4 ranks the vote has a strict majority: the drifted config is named exactly (3 against 1), as
// are the evidence detectors; the run still ends bitwise equal to a clean one. So is a rank cut off
// from the network (network_partition): the others' collectives time out blaming it, the launcher
// restarts the job naming it, and the resumed run names it from its 3 peers' reports.
TEST(TrainerCampaign, OnFourRanksTheVotesNameTheDriftedAndThePartitionedRank) {
  TrainJob job("train_campaign");
  std::ofstream(job.root / "campaign.json") << R"({"seed": 2, "checkpoint_every": 5, "steps": 12, "faults": [
      {"type": "config_drift", "rank": 2, "step": 4},
      {"type": "payload_corruption", "rank": 3, "step": 7},
      {"type": "drop", "rank": 1, "step": 9}]})";
  const std::string steps = "--train.steps=12";
  ASSERT_EQ(job.launch(4, "run", {steps, "--fault.campaign=" + (job.root / "campaign.json").string()}, "a.log"), 0)
      << job.log("a.log");
  ASSERT_EQ(job.launch(4, "clean", {steps}, "clean.log"), 0) << job.log("clean.log");
  nlohmann::json rec = last_record(job.root / "run/metrics.jsonl", "campaign_score");
  ASSERT_FALSE(rec.is_null()) << job.log("a.log");
  const auto& s = rec["campaign_score"];
  std::map<std::string, std::string> by = {
      {"config_drift", "config hash"}, {"payload_corruption", "gradient checksum"}, {"drop", "data position self-check"}};
  ASSERT_EQ(s["faults"].size(), 3u) << s.dump(1);
  for (const auto& f : s["faults"]) {
    SCOPED_TRACE(f["type"].get<std::string>());
    EXPECT_EQ(f["outcome"], "exact") << f.dump();
    ASSERT_EQ(f["detected_by"].size(), 1u) << f.dump();
    EXPECT_EQ(f["detected_by"][0], by[f["type"]]) << f.dump();
  }
  EXPECT_TRUE(s["false_positives"].empty()) << s.dump(1);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(read_file((job.root / "run/checkpoints/step_00000012" / file).string()),
              read_file((job.root / "clean/checkpoints/step_00000012" / file).string()))
        << file;

  std::ofstream(job.root / "partition.json") << R"({"seed": 4, "checkpoint_every": 5, "steps": 12, "faults": [
      {"type": "network_partition", "rank": 2, "step": 8}]})";
  ASSERT_EQ(wait_for(job.start(4, {"--timeout", "3", "--max-restarts", "1", "--grace", "1"}, "part",
                               {steps, "--fault.campaign=" + (job.root / "partition.json").string()}, "part.log"),
                     150),
            0)
      << job.log("part.log");
  const std::string log = job.log("part.log");
  EXPECT_NE(log.find("TORCHELASTIC_RESTART_COUNT=1): failed rank 2: rank 2 (pid"), std::string::npos) << log;
  nlohmann::json prec = last_record(job.root / "part/metrics.jsonl", "campaign_score");
  ASSERT_FALSE(prec.is_null()) << log;
  const auto& p = prec["campaign_score"];
  ASSERT_EQ(p["faults"].size(), 1u) << p.dump(1);
  EXPECT_EQ(p["faults"][0]["outcome"], "exact") << p.dump(1);
  bool by_reports = false;
  for (const auto& d : p["faults"][0]["detected_by"]) by_reports = by_reports || d == "peers' reports";
  EXPECT_TRUE(by_reports) << p.dump(1);
  EXPECT_TRUE(p["false_positives"].empty()) << p.dump(1);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(read_file((job.root / "part/checkpoints/step_00000012" / file).string()),
              read_file((job.root / "clean/checkpoints/step_00000012" / file).string()))
        << file;
}

// The loader faults (a batch skipped, served twice, the next two swapped) put right before the step
// reads, and memory exhaustion (std::bad_alloc under a capped address space) and a network
// partition of one of the 2 ranks recovered by the launcher's restarts: one launch, the clean
// run's trajectory.
TEST(TrainerCampaign, LoaderFaultsArePutBackAndMemoryExhaustionAndAPartitionRestartTheJobBitwise) {
  TrainJob job("train_campaign");
  std::ofstream(job.root / "campaign.json") << R"({"seed": 8, "checkpoint_every": 5, "steps": 24, "faults": [
      {"type": "drop", "rank": 1, "step": 4},
      {"type": "duplicate", "rank": 0, "step": 8},
      {"type": "resource_exhaustion", "rank": 1, "step": 12},
      {"type": "reorder", "rank": 1, "step": 17},
      {"type": "network_partition", "rank": 1, "step": 21}]})";
  ASSERT_EQ(wait_for(job.start(2, {"--max-restarts", "2", "--timeout", "3", "--grace", "1"}, "run",
                               {"--fault.campaign=" + (job.root / "campaign.json").string()}, "a.log"),
                     120),
            0)
      << job.log("a.log");
  ASSERT_EQ(job.launch(2, "clean", {}, "clean.log"), 0) << job.log("clean.log");
  EXPECT_NE(job.log("a.log").find("restarting the whole job (restart 1 of 2"), std::string::npos) << job.log("a.log");
  nlohmann::json rec = last_record(job.root / "run/metrics.jsonl", "campaign_score");
  ASSERT_FALSE(rec.is_null()) << job.log("a.log");
  const auto& s = rec["campaign_score"];
  ASSERT_EQ(s["faults"].size(), 5u) << s.dump(1);
  for (const auto& f : s["faults"]) {
    const std::string type = f["type"];
    SCOPED_TRACE(type);
    EXPECT_TRUE(f["fired"].get<bool>());
    if (type == "network_partition") {
      // At 2 ranks the partitioned rank and its one peer both time out; the peer's report blaming
      // it is one accuser of 2, no strict majority: inconclusive, never a wrong rank. (The launcher
      // still names rank 1 for the restart: it alone ended without a report of a failed collective.)
      EXPECT_EQ(f["outcome"], "inconclusive") << f.dump();
      EXPECT_NE(job.log("a.log").find("restart 2 of 2, TORCHELASTIC_RESTART_COUNT=2): failed rank 1: rank 1 (pid"),
                std::string::npos)
          << job.log("a.log");
      continue;
    }
    EXPECT_EQ(f["outcome"], "exact") << f.dump();
    ASSERT_FALSE(f["detected_by"].empty()) << f.dump();
    EXPECT_EQ(f["detected_by"][0], type == "resource_exhaustion" ? "exit status" : "data position self-check")
        << f.dump();
  }
  EXPECT_TRUE(s["false_positives"].empty()) << s.dump(1);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(read_file((job.root / "run/checkpoints/step_00000024" / file).string()),
              read_file((job.root / "clean/checkpoints/step_00000024" / file).string()))
        << file;
}

// A rank that stops (hang: SIGSTOP) and one that stays away from the collective past its peers'
// timeout (timeout): fatal, named after the fact, and recovered inside one launch by its restart.
TEST(TrainerCampaign, AHangIsNamedByTheWatcherATimeoutByWhoWaitsOnWhomAndBothRecoverInOneLaunch) {
  TrainJob job("train_campaign");
  std::ofstream(job.root / "hang.json") << R"({"seed": 6, "checkpoint_every": 5, "steps": 24, "faults": [
      {"type": "hang", "rank": 1, "step": 7}]})";
  std::ofstream(job.root / "timeout.json") << R"({"seed": 6, "checkpoint_every": 5, "steps": 24, "faults": [
      {"type": "timeout", "rank": 1, "step": 13}]})";
  // The watcher names the stopped rank after 3 s without progress (every healthy silence of this
  // job is well under a second); the launcher's teardown SIGCONTs it, and the job starts again.
  ASSERT_EQ(wait_for(job.start(2, {"--watch", "--watch-hang-s", "3", "--watch-dir", (job.root / "watch").string(),
                                   "--max-restarts", "1", "--grace", "1"},
                               "hang", {"--fault.campaign=" + (job.root / "hang.json").string()}, "hang.log"),
                     150),
            0)
      << job.log("hang.log");
  // No watcher: the peer's collective times out (3 s); the sleeping rank is torn down.
  ASSERT_EQ(wait_for(job.start(2, {"--timeout", "3", "--max-restarts", "1", "--grace", "1"}, "timeout",
                               {"--fault.campaign=" + (job.root / "timeout.json").string()}, "timeout.log"),
                     150),
            0)
      << job.log("timeout.log");
  ASSERT_EQ(job.launch(2, "clean", {}, "clean.log"), 0) << job.log("clean.log");
  for (auto [run, type, detector] : {std::tuple{"hang", "hang", "watcher"},
                                     std::tuple{"timeout", "timeout", "who waits on whom"}}) {
    SCOPED_TRACE(run);
    const std::string log = job.log(std::string(run) + ".log");
    EXPECT_NE(log.find("restarting the whole job (restart 1 of 1"), std::string::npos) << log;
    // The launcher names the rank the job failed because of, not rank 0, which timed out first.
    if (std::string(run) == "timeout")
      EXPECT_NE(log.find("TORCHELASTIC_RESTART_COUNT=1): failed rank 1: rank 1 (pid"), std::string::npos) << log;
    nlohmann::json rec = last_record(job.root / run / "metrics.jsonl", "campaign_score");
    ASSERT_FALSE(rec.is_null()) << log;
    const auto& s = rec["campaign_score"];
    ASSERT_EQ(s["faults"].size(), 1u) << s.dump(1);
    const auto& f = s["faults"][0];
    EXPECT_EQ(f["type"], type);
    EXPECT_EQ(f["outcome"], "exact") << f.dump();
    // Other detectors may see it too (the stopped rank's boundary timing, a vote: inconclusive at
    // 2 ranks); the outcome is exact only if none named another rank.
    bool by = false;
    for (const auto& d : f["detected_by"]) by = by || d == detector;
    EXPECT_TRUE(by) << f.dump();
    EXPECT_TRUE(s["false_positives"].empty()) << s.dump(1);
    for (const char* file : {"model.safetensors", "optimizer.safetensors"})
      EXPECT_EQ(read_file((job.root / run / "checkpoints/step_00000024" / file).string()),
                read_file((job.root / "clean/checkpoints/step_00000024" / file).string()))
          << file;
  }
}

}  // namespace atl::resilience::test
