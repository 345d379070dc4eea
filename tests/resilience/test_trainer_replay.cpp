// SCOUT's cross-replay inside `atoll train` ([fault] replay_every, train/replay_hook.h), on real
// `atoll launch` jobs. The injected fault ([fault] flip_grad_at_step) flips one bit of one rank's
// gradient share after its backward and before the all-reduce: every rank then averages the same
// bad gradient, so nothing downstream (signatures, the gradient's finiteness) could see it.
//  - 4 ranks: the replay names exactly that rank, the step is computed again, and the run ends
//    with the bits of an unaudited run (auditing changes nothing it should not);
//  - without repair the corruption enters the weights: the checkpoints after it carry a tainted
//    certificate, retention keeps the last clean one, and a certified resume goes back to it and
//    ends with the bits of a clean run; a clean audited run finds nothing and certifies everything;
//  - a fault that comes back on the recomputation stops the run before the update, naming the rank;
//  - 2 ranks have no strict majority: inconclusive, never a wrong rank;
//  - the keys are refused where they cannot work, named with where they were set.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "train_job.h"

namespace atl::resilience::test {
namespace fs = std::filesystem;

namespace {
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
const std::vector<std::string> kAudit = {"--fault.replay_every=1", "--log.every=1"};
const std::vector<std::string> kFlip7 = {"--fault.flip_grad_at_step=7"};

void expect_same_weights(const fs::path& a, const fs::path& b) {
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    ASSERT_TRUE(fs::exists(a / f) && fs::exists(b / f)) << a << " " << b;
    EXPECT_TRUE(read_file((a / f).string()) == read_file((b / f).string())) << f << " differs: " << a << " vs " << b;
  }
}
nlohmann::json certificate(const fs::path& ckpt) {
  std::ifstream in(ckpt / "state.json");
  return nlohmann::json::parse(in).at("replay_certificate");
}
}  // namespace

TEST(TrainerReplay, AFlippedBitInOneRanksShareIsNamedRedoneAndTheRunEndsAsAnUnauditedOne) {
  TrainJob job("train_replay4");
  ASSERT_EQ(job.launch(4, "plain", {}, "plain.log"), 0) << job.log("plain.log");
  ASSERT_EQ(job.launch(4, "audit", with(with(kAudit, kFlip7), {"--fault.flip_grad_rank=2"}), "audit.log"), 0)
      << job.log("audit.log");
  const std::string log = job.log("audit.log");
  EXPECT_NE(log.find("step 7 | replay: silent data corruption on rank(s) 2;"), std::string::npos) << log;
  EXPECT_NE(log.find("step 7 | replay: the recomputed step reproduced on every rank; applied"), std::string::npos) << log;
  auto recs = records_with(job.root / "audit/metrics.jsonl", "replay_ms");
  ASSERT_EQ(recs.size(), 24u);  // every step audited
  int found = 0;
  for (const auto& r : recs) {
    if (!r.contains("replay")) continue;
    ++found;
    EXPECT_EQ(r["step"], 7) << r.dump();
    EXPECT_EQ(r["replay"]["sdc"], nlohmann::json({2})) << r.dump();  // exactly the injected rank
    EXPECT_EQ(r["replay"]["corrupt_shares"], nlohmann::json({2})) << r.dump();
    EXPECT_EQ(r["replay"]["redone"], 1) << r.dump();
    EXPECT_FALSE(r["replay"].contains("again")) << r.dump();  // the recomputation was clean
  }
  EXPECT_EQ(found, 1);
  // The discarded step left no trace: the audited run's weights and optimizer state are an
  // unaudited run's, bit for bit (the replays and the held-back sync change nothing).
  expect_same_weights(job.root / "plain/checkpoints/step_00000024", job.root / "audit/checkpoints/step_00000024");
  EXPECT_TRUE(certificate(job.root / "audit/checkpoints/step_00000024")["clean"].get<bool>());
}

TEST(TrainerReplay, WithoutRepairTheCheckpointsAfterTheCorruptionAreUncertifiedAndACertifiedResumeGoesBackPastThem) {
  TrainJob job("train_replay3");
  // A clean audited run: no finding at any step, every checkpoint certified.
  ASSERT_EQ(job.launch(3, "clean", kAudit, "clean.log"), 0) << job.log("clean.log");
  EXPECT_TRUE(records_with(job.root / "clean/metrics.jsonl", "replay").empty()) << job.log("clean.log");
  for (const char* c : {"step_00000015", "step_00000020", "step_00000024"}) {
    auto cert = certificate(job.root / "clean/checkpoints" / c);
    EXPECT_TRUE(cert["clean"].get<bool>()) << c << ": " << cert.dump();
  }

  const auto bad = with(with(kAudit, kFlip7), {"--fault.flip_grad_rank=1", "--fault.replay_repair=false"});
  ASSERT_EQ(job.launch(3, "bad", bad, "bad.log"), 0) << job.log("bad.log");
  const std::string log = job.log("bad.log");
  EXPECT_NE(log.find("step 7 | replay: silent data corruption on rank(s) 1;"), std::string::npos) << log;
  EXPECT_NE(log.find("fault.replay_repair = false: the update is applied as it is"), std::string::npos) << log;
  const fs::path ck = job.root / "bad/checkpoints";
  // Retention (3 kept) removed steps 10 and 15 but kept step 5, the newest clean one, which plain
  // retention would have removed first.
  ASSERT_TRUE(fs::exists(ck / "step_00000005")) << log;
  EXPECT_FALSE(fs::exists(ck / "step_00000010"));
  EXPECT_TRUE(certificate(ck / "step_00000005")["clean"].get<bool>());
  for (const char* c : {"step_00000020", "step_00000024"}) {
    auto cert = certificate(ck / c);
    EXPECT_FALSE(cert["clean"].get<bool>()) << c << ": " << cert.dump();
    EXPECT_NE(cert["finding"].get<std::string>().find("descends from"), std::string::npos) << cert.dump();
  }
  // Plain --resume would take step 24; a certified one goes back to step 5 and trains on from there.
  ASSERT_EQ(job.launch(3, "bad", with(kAudit, {"--fault.resume_certified=true", "--resume"}), "resume.log"), 0)
      << job.log("resume.log");
  const std::string rlog = job.log("resume.log");
  EXPECT_NE(rlog.find("skipping step_00000024: its replay certificate is not clean"), std::string::npos) << rlog;
  EXPECT_NE(rlog.find("resumed from " + (ck / "step_00000005").string() + " at step 5"), std::string::npos) << rlog;
  expect_same_weights(job.root / "clean/checkpoints/step_00000024", ck / "step_00000024");
  EXPECT_TRUE(certificate(ck / "step_00000024")["clean"].get<bool>());
}

TEST(TrainerReplay, AFaultThatComesBackOnTheRecomputationStopsTheRunNamingTheRankBeforeTheUpdate) {
  TrainJob job("train_replay_persist");
  const auto args = with(with(kAudit, kFlip7), {"--fault.flip_grad_rank=3", "--fault.flip_grad_every_attempt=true"});
  EXPECT_NE(job.launch(4, "run", args, "run.log"), 0);
  const std::string log = job.log("run.log");
  EXPECT_NE(log.find("replay: step 7: the gradient share of rank(s) 3 did not reproduce, again after the step was "
                     "computed a second time"),
            std::string::npos)
      << log;
  auto recs = records_with(job.root / "run/metrics.jsonl", "replay_ms");
  ASSERT_FALSE(recs.empty());
  EXPECT_EQ(recs.back()["step"], 6);  // step 7 was never applied
}

TEST(TrainerReplay, TwoRanksAreInconclusiveNeverAWrongRank) {
  TrainJob job("train_replay2");
  ASSERT_EQ(job.launch(2, "run", with(with(kAudit, kFlip7), {"--fault.flip_grad_rank=1"}), "run.log"), 0)
      << job.log("run.log");
  auto recs = records_with(job.root / "run/metrics.jsonl", "replay");
  ASSERT_EQ(recs.size(), 1u) << job.log("run.log");
  EXPECT_EQ(recs[0]["step"], 7);
  EXPECT_TRUE(recs[0]["replay"]["sdc"].empty()) << recs[0].dump();  // no rank named
  EXPECT_EQ(recs[0]["replay"]["inconclusive"], nlohmann::json({1})) << recs[0].dump();
  EXPECT_EQ(recs[0]["replay"]["redone"], 1) << recs[0].dump();
}

TEST(TrainerReplay, TheKeysAreRefusedWhereTheyCannotWorkNamingWhereTheyWereSet) {
  TrainJob job("train_replay_keys");
  struct Case {
    int ranks;
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {1, {"--fault.replay_every=1"}, "fault.replay_every (command line (--fault.replay_every)) replays each rank's share on other ranks: it needs a distributed run"},
      {2, {"--fault.replay_every=1", "--parallel.strategy=zero3"}, "fault.replay_every (command line (--fault.replay_every)) replays a rank's share of a step on ranks that hold the whole model"},
      {2, {"--fault.replay_every=2", "--fault.resume_certified=true"}, "fault.resume_certified (command line (--fault.resume_certified)) needs fault.replay_every = 1 (it is 2)"},
      {2, {"--fault.replay_every=2", "--fault.flip_grad_at_step=7"}, "fault.flip_grad_at_step (command line (--fault.flip_grad_at_step)) = 7 injects a corruption for the replay to find: it must be a replayed step"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string name = "case" + std::to_string(i++), log = name + ".log";
    int rc;
    if (c.ranks == 1) {
      std::vector<std::string> argv = {atoll_exe(), "train", (job.root / "tiny.toml").string(),
                                       "--run.dir=" + (job.root / name).string()};
      argv.insert(argv.end(), c.args.begin(), c.args.end());
      rc = wait_for(spawn(argv, {"OMP_NUM_THREADS=1"}, (job.root / log).string()), 120);
    } else {
      rc = job.launch(c.ranks, name, c.args, log);
    }
    EXPECT_NE(rc, 0) << name;
    EXPECT_NE(job.log(log).find(c.says), std::string::npos) << name << ":\n" << job.log(log);
  }
}

}  // namespace atl::resilience::test
