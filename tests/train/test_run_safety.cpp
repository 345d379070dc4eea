// Issue 10, the run directory: --resume takes the newest complete, verified checkpoint whatever
// `latest` says; a run is never reused or destroyed by accident (--overwrite moves it aside);
// retention orders by step and keeps what a run stands on; metrics.jsonl is only appended to and
// its readers drop superseded lines; one job per run dir; bad directories and bad checkpoint
// state are diagnosed at start-up.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fileio.h"
#include "resilience/checkpoint.h"
#include "resilience/checkpoint_select.h"
#include "train/metrics.h"
#include "train/run_dir.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

using namespace atl;
using namespace atl::test;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

int count_lines(const fs::path& p) {
  std::ifstream f(p);
  std::string l;
  int n = 0;
  while (std::getline(f, l)) ++n;
  return n;
}

std::string host() {
  char h[256] = {0};
  ::gethostname(h, sizeof h - 1);
  return h;
}

fs::path ck(const fs::path& root, int64_t step) {
  return root / "run" / "checkpoints" / fmt::format("step_{:08d}", step);
}

// Rewrites a checkpoint file and its manifest entry, so that the checksums still match.
void rewrite_with_valid_checksum(const fs::path& dir, const std::string& file, const std::string& bytes) {
  write_file_atomic((dir / file).string(), bytes);
  auto m = nlohmann::json::parse(read_file((dir / "manifest.json").string()));
  m["files"][file] = {{"bytes", bytes.size()}, {"crc32c", crc32c(bytes)}};
  write_file_atomic((dir / "manifest.json").string(), m.dump(2));
}

// The tiny config on one thread without evaluation: these tests are about files, not numerics.
Config quick(const fs::path& root, const std::string& data, int64_t steps) {
  Config c = tiny_config(root, data, steps);
  c.set_override("train.threads=1");
  c.set_override("eval.every=0");
  return c;
}

}  // namespace

// The issue's repro: deleting the newest checkpoint must not restart the run from scratch (which
// truncated metrics.jsonl, overwrote step 5 and let retention delete it).
TEST(RunSafety, ResumeUsesNewestVerifiedCheckpointWhateverLatestSays) {
  fs::path a = scratch("newest_a"), b = scratch("newest_b");
  std::string data = make_data(a);
  auto cfg = [&](const fs::path& root) {
    Config c = quick(root, data, 10);
    c.set_override("checkpoint.every=5");
    return c;
  };
  std::vector<float> straight;
  {
    Config c = cfg(a);
    Trainer t(c);
    t.run(false);
    straight = weights_of(t);
  }
  {
    Config c = cfg(b);
    Trainer t(c);
    t.run(false);
  }
  std::string step5 = read_file((ck(b, 5) / "model.safetensors").string());
  fs::remove_all(ck(b, 10));  // `latest` now names a missing directory
  Config c = cfg(b);
  Trainer t(c);
  testing::internal::CaptureStderr();
  TrainResult r = t.run(true);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.start_step, 5) << "did not resume from step 5";
  EXPECT_EQ(r.final_step, 10);
  EXPECT_TRUE(contains(err, "'latest' names step_00000010")) << err;
  EXPECT_EQ(read_file((ck(b, 5) / "model.safetensors").string()), step5) << "step 5 was overwritten";
  std::vector<float> resumed = weights_of(t);
  ASSERT_EQ(straight.size(), resumed.size());
  EXPECT_EQ(std::memcmp(straight.data(), resumed.data(), straight.size() * sizeof(float)), 0);
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(RunSafety, CorruptNewestCheckpointFallsBackToTheOneBefore) {
  fs::path a = scratch("fallback");
  std::string data = make_data(a);
  {
    Config c = quick(a, data, 8);
    Trainer t(c);
    t.run(false);
  }
  fs::path f = ck(a, 8) / "optimizer.safetensors";
  std::string bytes = read_file(f.string());
  bytes[bytes.size() / 2] ^= 0x10;
  { std::ofstream(f, std::ios::binary) << bytes; }
  Config c = quick(a, data, 8);
  Trainer t(c);
  testing::internal::CaptureStderr();
  TrainResult r = t.run(true);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.start_step, 4);
  EXPECT_TRUE(contains(err, "skipping step_00000008")) << err;
  EXPECT_TRUE(contains(err, "checksum mismatch")) << err;
  EXPECT_EQ(checkpoint_problem(ck(a, 8).string()), "") << "the step 8 checkpoint was not rewritten";
  fs::remove_all(a);
}

// The issue's second repro: a 30-step run, then a 10-step run on the same dir without --resume.
TEST(RunSafety, ReuseWithoutResumeIsRefusedAndOverwriteMovesTheRunAside) {
  fs::path a = scratch("reuse");
  std::string data = make_data(a);
  {
    Config c = quick(a, data, 12);
    Trainer t(c);
    t.run(false);
  }
  fs::path run = a / "run";
  int lines = count_lines(run / "metrics.jsonl");
  std::string model12 = read_file((ck(a, 12) / "model.safetensors").string());
  {
    Config c = quick(a, data, 4);
    Trainer t(c);
    std::string m = error_of([&] { t.run(false); });
    EXPECT_TRUE(contains(m, "already holds a run")) << m;
    EXPECT_TRUE(contains(m, "--resume")) << m;
    EXPECT_TRUE(contains(m, "--overwrite")) << m;
  }
  EXPECT_EQ(count_lines(run / "metrics.jsonl"), lines) << "metrics.jsonl was touched";
  EXPECT_TRUE(fs::exists(ck(a, 12)));
  {
    Config c = quick(a, data, 4);
    c.set_override("run.overwrite=true");
    Trainer t(c);
    EXPECT_EQ(t.run(false).final_step, 4);
  }
  std::vector<fs::path> aside;
  for (auto& e : fs::directory_iterator(run))
    if (e.path().filename().string().rfind("old-", 0) == 0) aside.push_back(e.path());
  ASSERT_EQ(aside.size(), 1u);
  EXPECT_EQ(read_file((aside[0] / "checkpoints" / "step_00000012" / "model.safetensors").string()), model12);
  EXPECT_EQ(count_lines(aside[0] / "metrics.jsonl"), lines);
  EXPECT_FALSE(fs::exists(ck(a, 12)));
  // `latest` names a checkpoint that exists.
  std::string latest = read_file((run / "checkpoints" / "latest").string());
  EXPECT_TRUE(fs::exists(run / "checkpoints" / latest.substr(0, latest.find('\n')))) << latest;
  EXPECT_EQ(read_metrics((run / "metrics.jsonl").string()).size(), 4u);
  fs::remove_all(a);
}

TEST(RunSafety, RetentionOrdersByStepAndKeepsWhatTheRunStandsOn) {
  fs::path a = scratch("retention");
  fs::path d = a / "checkpoints";
  for (int64_t s : {99999999LL, 100000000LL, 7LL}) fs::create_directories(d / fmt::format("step_{:08d}", s));
  fs::create_directories(d / "step_00000005.tmp");
  auto all = list_checkpoints(d.string());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].step, 7);
  EXPECT_EQ(all[1].step, 99999999);
  EXPECT_EQ(all[2].step, 100000000);  // by name it would sort before 99999999
  auto v = retention_victims(all, 1, {7, 100000000});
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].step, 99999999);
  fs::remove_all(a);

  // In a run: resumed from step 4 with keep = 1, saving every step, step 4 survives.
  fs::path b = scratch("retention_run");
  std::string data = make_data(b);
  {
    Config c = quick(b, data, 4);
    Trainer t(c);
    t.run(false);
  }
  Config c = quick(b, data, 7);
  c.set_override("checkpoint.every=1");
  c.set_override("checkpoint.keep=1");
  Trainer t(c);
  t.run(true);
  EXPECT_TRUE(fs::exists(ck(b, 4))) << "the checkpoint the run resumed from was deleted";
  EXPECT_TRUE(fs::exists(ck(b, 7)));
  EXPECT_FALSE(fs::exists(ck(b, 5)));
  EXPECT_FALSE(fs::exists(ck(b, 6)));
  fs::remove_all(b);
}

// A crash after step 8's metrics but before its checkpoint: the resumed steps 5..8 supersede the
// lost ones; the file keeps every line, the reader returns each step once, the newest version.
TEST(RunSafety, MetricsAreAppendedOnResumeAndReadersSkipSupersededLines) {
  fs::path a = scratch("metrics");
  std::string data = make_data(a);
  {
    Config c = quick(a, data, 8);
    Trainer t(c);
    t.run(false);
  }
  fs::path m = a / "run" / "metrics.jsonl";
  fs::remove_all(ck(a, 8));
  int before = count_lines(m);
  { std::ofstream(m, std::ios::app) << R"({"step": 9, "lo)"; }  // torn by a kill -9
  Config c = quick(a, data, 8);
  Trainer t(c);
  TrainResult r = t.run(true);
  EXPECT_EQ(r.start_step, 4);
  EXPECT_EQ(count_lines(m), before + 1 + 1 + 4) << "metrics.jsonl was truncated or not appended";
  int skipped = 0;
  auto recs = read_metrics(m.string(), &skipped);
  ASSERT_EQ(recs.size(), 8u);
  for (size_t i = 0; i < recs.size(); ++i) EXPECT_EQ(recs[i]["step"].get<int64_t>(), int64_t(i + 1));
  EXPECT_EQ(recs.back()["loss"].get<double>(), r.final_loss) << "the superseded step 8 was kept";
  EXPECT_EQ(skipped, 1 + 4);  // the torn line and the four superseded steps
  // The scripts' reader (tools/metrics_jsonl.py) agrees.
  CmdResult py = run_shell(fmt::format("python3 '{}/tools/metrics_jsonl.py' '{}' step", ATOLL_SOURCE_DIR, m.string()));
  EXPECT_EQ(py.out, "1\n2\n3\n4\n5\n6\n7\n8\n") << py.out;
  // Every line is valid JSON again after the torn one.
  std::ifstream f(m);
  std::string line;
  int bad = 0;
  while (std::getline(f, line)) bad += nlohmann::json::parse(line, nullptr, false).is_discarded();
  EXPECT_EQ(bad, 1);
  fs::remove_all(a);
}

TEST(RunSafety, SecondJobOnARunDirIsRefusedNamingTheHolder) {
  fs::path a = scratch("lock");
  std::string data = make_data(a);
  fs::create_directories(a / "run");
  {
    RunDirLock held((a / "run").string());
    Config c = quick(a, data, 4);
    Trainer t(c);
    std::string m = error_of([&] { t.run(false); });
    EXPECT_TRUE(contains(m, "in use by another job")) << m;
    EXPECT_TRUE(contains(m, fmt::format("pid {} on host {}", ::getpid(), host()))) << m;
    EXPECT_FALSE(fs::exists(a / "run" / "metrics.jsonl"));
  }
  // A lock file left by a process that is gone is taken over, saying so.
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  { std::ofstream(a / "run" / "lock") << "host=" << host() << " pid=" << child << " started=2026-01-01T00:00:00Z\n"; }
  Config c = quick(a, data, 4);
  Trainer t(c);
  testing::internal::CaptureStderr();
  EXPECT_EQ(t.run(false).final_step, 4);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(err, fmt::format("taking over a stale lock left by pid {}", child))) << err;
  EXPECT_FALSE(fs::exists(a / "run" / "lock")) << "the lock outlived the run";
  fs::remove_all(a);
}

TEST(RunSafety, FileTypedRunOrCheckpointDirIsDiagnosedAtStartUp) {
  fs::path a = scratch("filedir");
  std::string data = make_data(a);
  { std::ofstream(a / "run") << "not a directory"; }
  {
    Config c = quick(a, data, 4);
    Trainer t(c);
    std::string m = error_of([&] { t.run(false); });
    EXPECT_TRUE(contains(m, "run.dir '" + (a / "run").string() + "' is a file, not a directory")) << m;
  }
  fs::remove(a / "run");
  fs::create_directories(a / "run");
  { std::ofstream(a / "run" / "checkpoints") << "not a directory"; }
  Config c = quick(a, data, 4);
  Trainer t(c);
  std::string m = error_of([&] { t.run(false); });
  EXPECT_TRUE(contains(m, "checkpoint directory '" + (a / "run" / "checkpoints").string() + "' is a file")) << m;
  EXPECT_FALSE(fs::exists(a / "run" / "metrics.jsonl")) << "training started before the check";
  fs::remove_all(a);
}

TEST(RunSafety, CorruptStateWithValidChecksumIsDiagnosed) {
  fs::path a = scratch("state");
  std::string data = make_data(a);
  {
    Config c = quick(a, data, 4);
    Trainer t(c);
    t.run(false);
  }
  rewrite_with_valid_checksum(ck(a, 4), "state.json", "{\"step\": 4, \"sample_rng\": [1, 2");
  Config c = quick(a, data, 8);
  Trainer t(c);
  std::string m = error_of([&] { t.run(true); });
  EXPECT_TRUE(contains(m, "state.json is not valid JSON although its checksum matches")) << m;
  EXPECT_FALSE(contains(m, "internal error")) << m;
  // Valid JSON without what the trainer needs is named too.
  rewrite_with_valid_checksum(ck(a, 4), "state.json", "{\"step\": 4}");
  EXPECT_TRUE(contains(checkpoint_problem(ck(a, 4).string()), "lacks a valid 'sample_rng'"));
  fs::remove_all(a);
}

TEST(RunSafety, ResumeWithFewerStepsSaysNothingToTrain) {
  fs::path a = scratch("fewer");
  std::string data = make_data(a);
  {
    Config c = quick(a, data, 8);
    Trainer t(c);
    t.run(false);
  }
  Config c = quick(a, data, 4);
  Trainer t(c);
  testing::internal::CaptureStderr();
  TrainResult r = t.run(true);
  std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.start_step, 8);
  EXPECT_EQ(r.final_step, 8);
  EXPECT_TRUE(contains(err, "already at step 8")) << err;
  EXPECT_TRUE(contains(err, "nothing to train")) << err;
  fs::remove_all(a);
}

TEST(RunSafety, ResumingWithAnotherOptimizerSaysWhich) {
  fs::path a = scratch("otheropt");
  std::string data = make_data(a);
  {
    Config c = quick(a, data, 4);
    Trainer t(c);
    t.run(false);
  }
  Config c = quick(a, data, 8);
  c.set_override("optim.type=muon");
  Trainer t(c);
  std::string m = error_of([&] { t.run(true); });
  EXPECT_TRUE(contains(m, "the state of the 'adamw' optimizer, but the config trains with 'adamw+muon'")) << m;
  fs::remove_all(a);
}

TEST(RunSafety, StaleTemporaryCheckpointDirsAreCleanedIfOurs) {
  fs::path a = scratch("stale");
  std::string data = make_data(a);
  fs::path d = a / "run" / "checkpoints";
  fs::create_directories(d / "step_00000099.tmp");
  { std::ofstream(d / "step_00000099.tmp" / "model.safetensors.tmp") << "partial"; }
  fs::create_directories(d / "step_00000098.tmp");
  { std::ofstream(d / "step_00000098.tmp" / "notes.txt") << "the user's"; }
  Config c = quick(a, data, 4);
  Trainer t(c);
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  t.run(false);
  std::string out = testing::internal::GetCapturedStdout() + testing::internal::GetCapturedStderr();
  EXPECT_FALSE(fs::exists(d / "step_00000099.tmp"));
  EXPECT_TRUE(contains(out, "step_00000099.tmp', left by a checkpoint save that did not finish")) << out;
  EXPECT_TRUE(fs::exists(d / "step_00000098.tmp" / "notes.txt")) << "removed a directory atoll did not write";
  EXPECT_TRUE(contains(out, "holds files atoll does not write")) << out;
  fs::remove_all(a);
}
