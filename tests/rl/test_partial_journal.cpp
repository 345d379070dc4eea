// Partial rollouts through Belayer's journal (rl.partial_tokens with rl.journal_dir,
// rl/partial_journal.cpp). Rounds of 2 tokens, completions of up to 6: rollouts are cut and carried
// into later steps. Checked: the journaled steps are the unjournaled ones bit for bit; every
// rollout keeps one journal id across the rounds and steps it spans, and its lines concatenate to
// its completion; a process SIGKILLed mid-round of a step holding carried groups is taken over by a
// fresh engine (the shadow's way: the pool the dead process carried into the step, then the step
// re-run over its journals) that returns the uninterrupted run's batch, and the next step's, bit for bit.
#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <unistd.h>

#include "core/threads.h"
#include "parallel/harness.h"
#include "rl/rl_engine.h"
#include "tiny_model.h"

namespace atl::rl {
namespace {

constexpr int kStream = 1;
constexpr int64_t kGroup = 2;

std::string dir_for(const std::string& what) {
  return (std::filesystem::temp_directory_path() / ("atoll_rl_pjournal_" + std::to_string(getpid()) + "_" + what))
      .string();
}

std::unique_ptr<RlEngine> engine(const std::string& dir, nn::Model& m) {
  Config cfg = rltest::rl_config("prompts = 2\ngroup_size = 2\nmax_new_tokens = 6\npartial_tokens = 2\n"
                                 "temperature = 1.0\n" +
                                 (dir.empty() ? std::string() : "journal_dir = \"" + dir + "\"\n"));
  auto e = std::make_unique<RlEngine>(RlConfig::from_config(cfg, 9));
  e->setup(m, nullptr, 0, 1);
  return e;
}

void expect_same(const RolloutBatch& got, const RolloutBatch& want, int64_t step) {
  ASSERT_EQ(got.samples.size(), want.samples.size()) << "step " << step;
  ASSERT_EQ(got.B, want.B);
  ASSERT_EQ(got.T, want.T);
  for (size_t i = 0; i < want.samples.size(); ++i) {
    EXPECT_EQ(got.samples[i].completion, want.samples[i].completion) << "step " << step << " rollout " << i;
    EXPECT_EQ(got.samples[i].stopped, want.samples[i].stopped) << i;
    EXPECT_EQ(got.samples[i].uid, want.samples[i].uid) << i;
    EXPECT_EQ(got.samples[i].token_version, want.samples[i].token_version) << i;
  }
  EXPECT_EQ(std::memcmp(got.old_logp.f32(), want.old_logp.f32(), size_t(want.old_logp.numel()) * 4), 0)
      << "step " << step << ": behaviour log-probs differ";
}

std::string files_of(const std::string& dir) {  // every file's name and bytes, in name order
  std::map<std::string, std::string> by;
  for (const auto& f : std::filesystem::directory_iterator(dir))
    by[f.path().filename().string()] = parallel::test::read_file(f.path().string());
  std::string all;
  for (auto& [n, b] : by) all += n + "\n" + b + "\n";
  return all;
}

// The child of the kill test (ATOLL_RL_PJ_DIR set): journaled steps 0.. until it SIGKILLs itself
// after ATOLL_RL_PJ_DIE new tokens. Alone: two runs leave byte-equal journals and pools.
TEST(RlPartialJournal, RolloutProgram) {
  auto m = rltest::tiny_model(21);
  if (const char* d = std::getenv("ATOLL_RL_PJ_DIR")) {
    auto e = engine(d, *m);
    e->journal_die_after = std::atoll(std::getenv("ATOLL_RL_PJ_DIE"));
    for (int64_t s = 0; s < 100; ++s) e->rollouts(*m, s, kStream, false, s);
    FAIL() << "the rollout process was to die";
  }
  const std::string a = dir_for("rep_a"), b = dir_for("rep_b");
  std::filesystem::remove_all(a);
  std::filesystem::remove_all(b);
  auto ea = engine(a, *m), eb = engine(b, *m);
  for (int64_t s = 0; s < 3; ++s) {
    ea->rollouts(*m, s, kStream, false, s);
    eb->rollouts(*m, s, kStream, false, s);
  }
  const std::string fa = files_of(a);
  EXPECT_NE(fa.find("_pool"), std::string::npos) << fa;
  EXPECT_EQ(fa, files_of(b));
  std::filesystem::remove_all(a);
  std::filesystem::remove_all(b);
}

TEST(RlPartialJournal, RoundsEqualTheUnjournaledAndEachRolloutsLinesSpanItsSteps) {
  const std::string dir = dir_for("lines");
  std::filesystem::remove_all(dir);
  auto m = rltest::tiny_model(21);
  auto plain = engine("", *m), journaled = engine(dir, *m);
  const std::regex round_file(R"(rollouts_r1_s(\d+)_v\d+_[0-9a-f]{16}_partial_p(\d+)\.journal)");
  std::map<int64_t, std::vector<int32_t>> lines;  // journal id -> its tokens over every round so far
  std::map<int64_t, bool> stopped;
  std::map<int64_t, std::set<int64_t>> steps_of;  // journal id -> the steps whose rounds hold its lines
  int64_t spanning = 0;
  for (int64_t s = 0; s < 6; ++s) {
    const RolloutBatch want = plain->rollouts(*m, s, kStream, false, s);
    const RolloutBatch got = journaled->rollouts(*m, s, kStream, false, s);
    expect_same(got, want, s);
    // This step's round journals, in round order (the previous step's were removed).
    std::map<int64_t, std::string> rounds;
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      std::smatch mt;
      const std::string name = f.path().filename().string();
      if (!std::regex_match(name, mt, round_file)) continue;
      ASSERT_EQ(std::stoll(mt[1]), s) << "a round journal of another step is left: " << name;
      rounds[std::stoll(mt[2])] = f.path().string();
    }
    ASSERT_FALSE(rounds.empty()) << "step " << s << " journaled no round";
    EXPECT_TRUE(std::filesystem::exists(dir + "/rollouts_r1_s" + std::to_string(s + 1) + "_pool"))
        << "the pool carried into step " << s + 1 << " was not written";
    for (auto& [r, path] : rounds) {
      const JournalState js = JournalState::read(path);  // refuses a line after a rollout's D line
      EXPECT_EQ(js.torn_lines, 0);
      for (auto& [id, e] : js.requests) {
        EXPECT_TRUE(e.done) << path << ": rollout " << id << " did not finish its round";
        EXPECT_FALSE(stopped[id]) << "rollout " << id << " has lines after its end marker";
        lines[id].insert(lines[id].end(), e.tokens.begin(), e.tokens.end());
        stopped[id] = e.stopped;
        steps_of[id].insert(s);
      }
    }
    // Each trained rollout's lines, over every round of every step, are its completion.
    std::map<int64_t, int64_t> k_of;
    for (const Sample& sm : got.samples) {
      const int64_t id = sm.uid * kGroup + k_of[sm.uid]++;
      ASSERT_TRUE(lines.count(id)) << "rollout " << id << " was never journaled";
      EXPECT_EQ(lines[id], sm.completion) << "step " << s << ": rollout " << id << "'s journal lines";
      EXPECT_EQ(stopped[id], sm.stopped) << id;
      spanning += steps_of[id].size() > 1;
      lines.erase(id);  // trained once: its id must never come back
      stopped[id] = true;
    }
  }
  EXPECT_GT(spanning, 0) << "no rollout was carried across an update: the test saw no partial rollout";
  std::filesystem::remove_all(dir);
}

TEST(RlPartialJournal, ShadowContinuesAKilledProcessesCarriedRollouts) {
  constexpr int64_t kDeathStep = 2;
  const std::string ref_dir = dir_for("ref"), dir = dir_for("killed");
  std::filesystem::remove_all(ref_dir);
  std::filesystem::remove_all(dir);
  auto m = rltest::tiny_model(21);
  // The uninterrupted run, and where to kill: a few tokens into step 2's rounds.
  auto ref = engine(ref_dir, *m);
  std::vector<RolloutBatch> want;
  int64_t before = 0;
  for (int64_t s = 0; s <= kDeathStep + 1; ++s) {
    want.push_back(ref->rollouts(*m, s, kStream, false, s));
    if (s < kDeathStep) before += ref->journal_stats().sampled_tokens;
  }
  int64_t carried_in = 0;  // rollouts of step 2's batch begun in an earlier step
  for (const Sample& sm : want[kDeathStep].samples) carried_in += sm.token_version.front() < kDeathStep;
  ASSERT_GT(carried_in, 0) << "step " << kDeathStep << " holds no carried rollout: the takeover would test nothing";
  const int64_t die = before + 5;
  // The dead process runs with this one's threads, as a shadow takes the dead rank's config: the
  // bit-for-bit claim is per thread count, since OpenBLAS's fp32 products on an AVX2-only EPYC
  // round differently at 1 and 2 threads (the carried log-probs of step 3 then differ).
  const std::string log = dir_for("log");
  const int rc = parallel::test::run_command(
      {parallel::test::self_exe(), "--gtest_filter=RlPartialJournal.RolloutProgram"},
      {"ATOLL_RL_PJ_DIR=" + dir, "ATOLL_RL_PJ_DIE=" + std::to_string(die), "OMP_NUM_THREADS=" + std::to_string(num_threads()),
       "GTEST_OUTPUT="},
      log,
      60);
  EXPECT_EQ(rc, 128 + SIGKILL) << parallel::test::read_file(log);
  std::filesystem::remove(log);
  // The shadow: a fresh engine, weights loaded, no pool of its own.
  auto shadow = engine(dir, *m);
  shadow->adopt_pool(kStream, kDeathStep);
  const RolloutBatch got = shadow->rollouts(*m, kDeathStep, kStream, false, kDeathStep);
  EXPECT_GT(shadow->journal_stats().replayed_tokens, 0) << "the dead process's lines were not continued";
  EXPECT_GT(shadow->journal_stats().sampled_tokens, 0);
  expect_same(got, want[kDeathStep], kDeathStep);
  // The stream goes on from the shadow's pool as it would have from the dead process's.
  expect_same(shadow->rollouts(*m, kDeathStep + 1, kStream, false, kDeathStep + 1), want[kDeathStep + 1],
              kDeathStep + 1);
  // Without the dead process's pool the step is another one: the takeover needs it.
  auto blind = engine(dir_for("blind"), *m);
  const RolloutBatch other = blind->rollouts(*m, kDeathStep, kStream, false, kDeathStep);
  bool differs = other.samples.size() != got.samples.size();
  for (size_t i = 0; !differs && i < got.samples.size(); ++i)
    differs = other.samples[i].uid != got.samples[i].uid || other.samples[i].completion != got.samples[i].completion;
  EXPECT_TRUE(differs) << "a step without its carried pool gave the same batch: the pool check sees nothing";
  // A later step's pool missing is an error naming the file, never a silent fresh pool.
  auto lost = engine(dir_for("lost"), *m);
  try {
    lost->adopt_pool(kStream, kDeathStep);
    ADD_FAILURE() << "a missing carried pool was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rollouts_r1_s2_pool"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(ref_dir);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir_for("blind"));
  std::filesystem::remove_all(dir_for("lost"));
}

}  // namespace
}  // namespace atl::rl
