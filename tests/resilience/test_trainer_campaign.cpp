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
      "faults": [{"type": "stale_state", "rank": 1, "step": 3}]})";
  EXPECT_NE(job.launch(2, "run", {"--fault.campaign=" + (job.root / "campaign.json").string()}, "a.log"), 0);
  const std::string log = job.log("a.log");
  EXPECT_NE(log.find("fault 0 (stale_state) is not fired inside atoll train"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(job.root / "run/metrics.jsonl")) << "refused before step 1";
}

}  // namespace atl::resilience::test
