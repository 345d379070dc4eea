// Rollouts journaled through Belayer (rl.journal_dir; rl/belayer.h): the batch a rollout rank
// (disaggregated: RlEngine::rollouts with a trainer's seed rank) generates is journaled token by
// token. A rollout process SIGKILLed mid-trajectory leaves its prefixes; a shadow engine, weights
// already loaded, called for the same step, stream and version, skips the finished requests,
// continues the cut one from its prefix and returns the uninterrupted run's batch: every
// completion token-identical, every reward and behaviour log-prob bit equal, each request
// finished exactly once in the journal.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "core/error.h"
#include "parallel/harness.h"
#include "rl/rl_engine.h"
#include "tiny_model.h"

namespace atl::rl {
namespace {

constexpr int64_t kStep = 3, kVersion = 5;
constexpr int kStream = 1;  // a trainer's seed rank, as a disaggregated rollout rank draws it

std::string dir_for(const std::string& what) {
  return (std::filesystem::temp_directory_path() / ("atoll_rl_journal_" + std::to_string(getpid()) + "_" + what)).string();
}

std::unique_ptr<RlEngine> engine(const std::string& dir, nn::Model& m, bool batched = false) {
  Config cfg = rltest::rl_config("prompts = 3\ngroup_size = 4\nmax_new_tokens = 6\ntemperature = 1.0\n" +
                                 (dir.empty() ? std::string() : "journal_dir = \"" + dir + "\"\n") +
                                 (batched ? "journal_batched = true\n" : ""));
  auto e = std::make_unique<RlEngine>(RlConfig::from_config(cfg, 9));
  e->setup(m, nullptr, 0, 1);
  return e;
}

std::unique_ptr<nn::Model> model() { return rltest::tiny_model(21); }  // the same bits in every process

std::string only_journal(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path().string());
  EXPECT_EQ(files.size(), 1u) << dir;
  return files.empty() ? "" : files[0];
}

// The rollout process of the kill test when ATOLL_RL_JOURNAL_DIR is set: it dies by SIGKILL after
// ATOLL_RL_JOURNAL_DIE new tokens and never returns. Alone: journaled generation is repeatable.
TEST(RlJournal, RolloutProgram) {
  auto m = model();
  if (const char* d = std::getenv("ATOLL_RL_JOURNAL_DIR")) {
    auto e = engine(d, *m, std::getenv("ATOLL_RL_JOURNAL_BATCHED") != nullptr);
    e->journal_die_after = std::atoll(std::getenv("ATOLL_RL_JOURNAL_DIE"));
    e->rollouts(*m, kStep, kStream, false, kVersion);
    FAIL() << "the rollout process was to die";
  }
  const std::string a = dir_for("rep_a"), b = dir_for("rep_b");
  std::filesystem::remove_all(a);
  std::filesystem::remove_all(b);
  RolloutBatch x = engine(a, *m)->rollouts(*m, kStep, kStream, false, kVersion);
  RolloutBatch y = engine(b, *m)->rollouts(*m, kStep, kStream, false, kVersion);
  ASSERT_EQ(x.samples.size(), 12u);
  for (size_t i = 0; i < x.samples.size(); ++i) EXPECT_EQ(x.samples[i].completion, y.samples[i].completion) << i;
  EXPECT_EQ(parallel::test::read_file(only_journal(a)), parallel::test::read_file(only_journal(b)));
  std::filesystem::remove_all(a);
  std::filesystem::remove_all(b);
}

TEST(RlJournal, ShadowFinishesAKilledRolloutProcessesBatch) {
  // The shadow is ready before the rollout process starts: its own model and engine, weights loaded.
  auto shadow_model = model();
  const std::string ref_dir = dir_for("ref"), dir = dir_for("killed");
  std::filesystem::remove_all(ref_dir);
  std::filesystem::remove_all(dir);
  const RolloutBatch want = engine(ref_dir, *shadow_model)->rollouts(*shadow_model, kStep, kStream, false, kVersion);
  auto shadow = engine(dir, *shadow_model);

  const std::string log = dir_for("log");
  const int rc = parallel::test::run_command(
      {parallel::test::self_exe(), "--gtest_filter=RlJournal.RolloutProgram"},
      {"ATOLL_RL_JOURNAL_DIR=" + dir, "ATOLL_RL_JOURNAL_DIE=17", "OMP_NUM_THREADS=1", "GTEST_OUTPUT="}, log, 60);
  EXPECT_EQ(rc, 128 + SIGKILL) << parallel::test::read_file(log);
  std::filesystem::remove(log);
  const std::string journal = only_journal(dir);
  const JournalState before = JournalState::read(journal);
  int done_before = 0, partial = 0;
  for (auto& [id, e] : before.requests) {
    done_before += e.done;
    partial += !e.done && !e.tokens.empty();
  }
  ASSERT_GT(done_before, 0) << "the kill came before any rollout finished";
  ASSERT_LT(done_before, 12) << "the kill came after every rollout finished";
  ASSERT_EQ(partial, 1) << "the rollout process died mid-trajectory of exactly one rollout";

  const RolloutBatch got = shadow->rollouts(*shadow_model, kStep, kStream, false, kVersion);
  EXPECT_EQ(shadow->journal_stats().skipped, done_before);
  EXPECT_EQ(shadow->journal_stats().resumed, 1);
  EXPECT_GT(shadow->journal_stats().replayed_tokens, 0);
  ASSERT_EQ(got.samples.size(), want.samples.size());
  ASSERT_EQ(got.B, want.B);
  ASSERT_EQ(got.T, want.T);
  for (size_t i = 0; i < want.samples.size(); ++i) {
    EXPECT_EQ(got.samples[i].completion, want.samples[i].completion) << "rollout " << i << " differs";
    EXPECT_EQ(got.samples[i].stopped, want.samples[i].stopped) << i;
    EXPECT_EQ(got.samples[i].reward.total, want.samples[i].reward.total) << i;
    EXPECT_EQ(got.samples[i].group, want.samples[i].group) << i;
  }
  EXPECT_EQ(std::memcmp(got.old_logp.f32(), want.old_logp.f32(), size_t(want.old_logp.numel()) * 4), 0)
      << "behaviour log-probs differ";
  // Each rollout finished exactly once (JournalState::read refuses a line after its D line).
  const JournalState after = JournalState::read(journal);
  ASSERT_EQ(after.requests.size(), 12u);
  int finished_lines = 0;
  std::ifstream f(journal);
  for (std::string line; std::getline(f, line);) finished_lines += line.rfind("D ", 0) == 0;
  EXPECT_EQ(finished_lines, 12) << "a rollout was finished twice or never";
  std::filesystem::remove_all(ref_dir);
  std::filesystem::remove_all(dir);
}

void expect_same_batch(const RolloutBatch& got, const RolloutBatch& want) {
  ASSERT_EQ(got.samples.size(), want.samples.size());
  ASSERT_EQ(got.B, want.B);
  ASSERT_EQ(got.T, want.T);
  for (size_t i = 0; i < want.samples.size(); ++i) {
    EXPECT_EQ(got.samples[i].completion, want.samples[i].completion) << "rollout " << i << " differs";
    EXPECT_EQ(got.samples[i].stopped, want.samples[i].stopped) << i;
    EXPECT_EQ(got.samples[i].reward.total, want.samples[i].reward.total) << i;
  }
  EXPECT_EQ(std::memcmp(got.old_logp.f32(), want.old_logp.f32(), size_t(want.old_logp.numel()) * 4), 0)
      << "behaviour log-probs differ";
}

// rl.journal_batched: the journaled batch is decoded as generate_batch decodes it, so it is the
// unjournaled batch bit for bit (the B = 1 journal samples other tokens: its logits come from other
// kernel shapes).
TEST(RlJournal, BatchedJournalEqualsTheUnjournaledBatch) {
  const std::string dir = dir_for("batched_eq");
  std::filesystem::remove_all(dir);
  auto m = model();
  const RolloutBatch want = engine("", *m)->rollouts(*m, kStep, kStream, false, kVersion);
  auto e = engine(dir, *m, true);
  const RolloutBatch got = e->rollouts(*m, kStep, kStream, false, kVersion);
  EXPECT_EQ(e->journal_stats().fresh, 12);
  EXPECT_GT(e->journal_stats().sampled_tokens, 0);
  expect_same_batch(got, want);
  std::filesystem::remove_all(dir);
}

// A process SIGKILLed mid-batch (17 new tokens into the batched journal): a shadow engine,
// weights loaded, recomputes the batch, checks every journaled line and appends the rest; the
// batch is the uninterrupted run's and the journal ends byte-equal to an uninterrupted journal.
TEST(RlJournal, ShadowContinuesAKilledBatchedJournal) {
  auto shadow_model = model();
  const std::string ref_dir = dir_for("bref"), dir = dir_for("bkilled");
  std::filesystem::remove_all(ref_dir);
  std::filesystem::remove_all(dir);
  const RolloutBatch want = engine(ref_dir, *shadow_model, true)->rollouts(*shadow_model, kStep, kStream, false, kVersion);
  auto shadow = engine(dir, *shadow_model, true);
  const std::string log = dir_for("blog");
  const int rc = parallel::test::run_command(
      {parallel::test::self_exe(), "--gtest_filter=RlJournal.RolloutProgram"},
      {"ATOLL_RL_JOURNAL_DIR=" + dir, "ATOLL_RL_JOURNAL_DIE=17", "ATOLL_RL_JOURNAL_BATCHED=1", "OMP_NUM_THREADS=1",
       "GTEST_OUTPUT="},
      log, 60);
  EXPECT_EQ(rc, 128 + SIGKILL) << parallel::test::read_file(log);
  std::filesystem::remove(log);
  const std::string journal = only_journal(dir);
  const std::string cut = parallel::test::read_file(journal), full = parallel::test::read_file(only_journal(ref_dir));
  ASSERT_GT(cut.size(), 0u);
  ASSERT_LT(cut.size(), full.size()) << "the kill came after the batch was journaled";
  ASSERT_EQ(full.compare(0, cut.size(), cut), 0) << "the killed process journaled other lines";
  const RolloutBatch got = shadow->rollouts(*shadow_model, kStep, kStream, false, kVersion);
  EXPECT_EQ(shadow->journal_stats().replayed_tokens, 17);
  EXPECT_GT(shadow->journal_stats().sampled_tokens, 0);
  expect_same_batch(got, want);
  EXPECT_EQ(parallel::test::read_file(journal), full) << "the continued journal differs from an uninterrupted one";
  std::filesystem::remove_all(ref_dir);
  std::filesystem::remove_all(dir);
}

// A journal is only continued by the run that wrote it: other weights name another file.
TEST(RlJournal, AnotherRunsJournalIsNotContinued) {
  const std::string dir = dir_for("foreign");
  std::filesystem::remove_all(dir);
  auto m = model();
  RolloutBatch a = engine(dir, *m)->rollouts(*m, kStep, kStream, false, kVersion);
  auto other = rltest::tiny_model(22);
  auto e = engine(dir, *other);
  e->rollouts(*other, kStep, kStream, false, kVersion);
  EXPECT_EQ(e->journal_stats().skipped, 0) << "a journal of other weights was reused";
  EXPECT_EQ(e->journal_stats().fresh, 12);
  size_t files = 0;
  for ([[maybe_unused]] const auto& f : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 2u);
  std::filesystem::remove_all(dir);
}

TEST(RlJournal, KillInjectionWithoutAJournalIsRefusedNamingTheKey) {
  try {
    Config cfg = rltest::rl_config("prompts = 2\n[fault]\nrl_kill_after_tokens = 5\n");
    RlConfig::from_config(cfg, 1);
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fault.rl_kill_after_tokens"), std::string::npos) << e.what();
  }
}

// A shadow rank needs the disaggregated placement and a journal; a batched journal needs a journal.
TEST(RlJournal, ShadowRanksAndBatchedJournalWithoutTheirNeedsAreRefusedNamingTheKey) {
  for (const std::string& body : {std::string("shadow_ranks = 1\njournal_dir = \"/tmp/x\"\n"),
                                  std::string("placement = \"disaggregated\"\nshadow_ranks = 1\n"),
                                  std::string("journal_batched = true\n")}) {
    try {
      Config cfg = rltest::rl_config(body);
      RlConfig::from_config(cfg, 1);
      FAIL() << "accepted: " << body;
    } catch (const Error& e) {
      const std::string key = body.find("shadow") != std::string::npos ? "rl.shadow_ranks" : "rl.journal_batched";
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace atl::rl
