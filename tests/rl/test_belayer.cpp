// Belayer-style rollout recovery (rl/belayer.h): a rollout worker process is SIGKILLed in the
// middle of a trajectory; a shadow worker, pre-started in this process with the same weights,
// takes over from the journal. No request is lost or duplicated (each finishes exactly once in
// the journal) and every completion is token-identical to an uninterrupted run with the same seeds.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>

#include "core/error.h"
#include "nn/model.h"
#include "parallel/harness.h"
#include "rl/belayer.h"
#include "rl/verifiable_task.h"

namespace atl::rl {
namespace {

std::unique_ptr<nn::Model> belayer_model() {
  Config c = Config::parse("[model]\npreset = \"gpt2\"\nvocab_size = 128\nblock_size = 32\nn_layer = 2\nn_head = 2\n"
                           "n_embd = 32\n",
                           "model");
  auto m = nn::make_model(c, "model");
  m->init_weights(77);  // the same bits in every process
  return m;
}

std::vector<RolloutRequest> requests() {
  std::vector<RolloutRequest> r;
  for (int64_t i = 0; i < 12; ++i) r.push_back({100 + i, encode(std::to_string(10 + 7 * i) + "+" + std::to_string(i) + "=")});
  return r;
}

nn::SamplingConfig sampling() {
  nn::SamplingConfig s;
  s.temperature = 1.0f;
  s.top_k = 20;
  s.stop_tokens = {kEndMarker};
  s.seed = 4242;
  return s;
}

constexpr int64_t kMaxNew = 12;

std::string temp_path(const std::string& what) {
  return (std::filesystem::temp_directory_path() / ("atoll_belayer_" + std::to_string(getpid()) + "_" + what)).string();
}

// The worker side of the kill test when ATOLL_RL_BELAYER_JOURNAL is set (it never returns: it
// dies by SIGKILL after ATOLL_RL_BELAYER_DIE tokens); alone, an uninterrupted run is repeatable.
TEST(RlBelayer, WorkerProgram) {
  auto m = belayer_model();
  RolloutWorker w(*m, sampling(), kMaxNew);
  if (const char* j = std::getenv("ATOLL_RL_BELAYER_JOURNAL")) {
    w.run(requests(), j, std::atoll(std::getenv("ATOLL_RL_BELAYER_DIE")));
    FAIL() << "the worker was to die";
  }
  const std::string a = temp_path("a"), b = temp_path("b");
  WorkerStats s = w.run(requests(), a);
  w.run(requests(), b);
  EXPECT_EQ(s.fresh, 12);
  EXPECT_EQ(parallel::test::read_file(a), parallel::test::read_file(b));
  JournalState js = JournalState::read(a);
  EXPECT_EQ(js.requests.size(), 12u);
  for (auto& [id, e] : js.requests) EXPECT_TRUE(e.done) << id;
  // Running again over a finished journal does nothing.
  WorkerStats again = w.run(requests(), a);
  EXPECT_EQ(again.skipped, 12);
  EXPECT_EQ(again.sampled_tokens, 0);
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

TEST(RlBelayer, KilledWorkerShadowTakesOver) {
  // The shadow is ready before the worker starts: its own model, weights loaded.
  auto shadow_model = belayer_model();
  RolloutWorker shadow(*shadow_model, sampling(), kMaxNew);
  // The uninterrupted reference.
  const std::string ref = temp_path("ref");
  shadow.run(requests(), ref);
  const JournalState want = JournalState::read(ref);
  std::filesystem::remove(ref);

  const std::string journal = temp_path("journal"), log = temp_path("log");
  std::filesystem::remove(journal);
  const int rc = parallel::test::run_command(
      {parallel::test::self_exe(), "--gtest_filter=RlBelayer.WorkerProgram"},
      {"ATOLL_RL_BELAYER_JOURNAL=" + journal, "ATOLL_RL_BELAYER_DIE=23", "OMP_NUM_THREADS=1", "GTEST_OUTPUT="}, log, 60);
  EXPECT_EQ(rc, 128 + SIGKILL) << parallel::test::read_file(log);
  std::filesystem::remove(log);
  const JournalState before = JournalState::read(journal);
  int done_before = 0, partial = 0;
  for (auto& [id, e] : before.requests) {
    done_before += e.done;
    partial += !e.done && !e.tokens.empty();
  }
  ASSERT_GT(done_before, 0) << "the kill came before any request finished";
  ASSERT_LT(done_before, 12) << "the kill came after every request finished";
  EXPECT_EQ(partial, 1) << "the worker died mid-trajectory of exactly one request";

  WorkerStats st = shadow.run(requests(), journal);
  EXPECT_EQ(st.skipped, done_before);
  EXPECT_EQ(st.resumed, 1);
  EXPECT_GT(st.replayed_tokens, 0);
  // Every request finished exactly once (JournalState::read refuses a line after a D line) and
  // equals the uninterrupted run token for token.
  const JournalState got = JournalState::read(journal);
  ASSERT_EQ(got.requests.size(), 12u);
  for (auto& [id, e] : want.requests) {
    ASSERT_TRUE(got.requests.count(id)) << "request " << id << " was lost";
    const auto& g = got.requests.at(id);
    EXPECT_TRUE(g.done) << id;
    EXPECT_EQ(g.tokens, e.tokens) << "request " << id << " differs from the uninterrupted run";
    EXPECT_EQ(g.stopped, e.stopped) << id;
  }
  int finished_lines = 0;
  std::ifstream f(journal);
  for (std::string line; std::getline(f, line);) finished_lines += line.rfind("D ", 0) == 0;
  EXPECT_EQ(finished_lines, 12) << "a request was finished twice or never";
  std::filesystem::remove(journal);
}

// Belayer's hot standby (JournalFollower): a shadow that polled the journal as it grew (after every
// line, a half-written line included) holds the cut request's decoding state, so after the death
// only the lines logged since its last poll are replayed; the batch it finishes is the
// uninterrupted run's byte for byte (the same journal file), each request finished once.
TEST(RlBelayer, FollowerLeavesOnlyTheLinesSinceItsLastPollToReplay) {
  auto m = belayer_model();
  RolloutWorker shadow(*m, sampling(), kMaxNew);
  const std::string ref = temp_path("follow_ref"), j = temp_path("follow");
  shadow.run(requests(), ref);
  std::vector<std::string> lines;
  {
    std::ifstream f(ref);
    for (std::string l; std::getline(f, l);) lines.push_back(l);
  }
  // The death: after the 5th token of the first request that logs at least 5 (mid-trajectory).
  size_t cut = 0;
  std::map<std::string, int> tokens;
  for (size_t i = 0; i < lines.size() && !cut; ++i) {
    const std::string id = lines[i].substr(2, lines[i].find(' ', 2) - 2);
    if (lines[i][0] == 'T' && ++tokens[id] == 5 && i + 1 < lines.size() && lines[i + 1][0] == 'T') cut = i + 1;
  }
  ASSERT_GT(cut, 0u) << "no request logged 5 tokens and more";
  constexpr size_t kLag = 2;
  std::filesystem::remove(j);
  JournalFollower follower(shadow, requests(), j);
  EXPECT_EQ(follower.poll(), 0) << "no journal yet";
  int64_t followed = 0;
  for (size_t n = 1; n <= cut - kLag; ++n) {
    {
      std::ofstream f(j, std::ios::app);
      f << lines[n - 1] << "\n";
      if (n == cut - kLag) f << lines[n].substr(0, 3);  // a line half written at the last poll
    }
    followed += follower.poll();
  }
  {
    std::ofstream f(j, std::ios::trunc);  // the dead worker's journal: cut lines
    for (size_t n = 0; n < cut; ++n) f << lines[n] << "\n";
  }
  const WorkerStats st = shadow.run(requests(), j, 0, &follower);
  EXPECT_EQ(st.resumed, 1);
  EXPECT_EQ(st.followed_tokens, 5 - int64_t(kLag)) << "the follower's state was not used";
  EXPECT_EQ(st.replayed_tokens - st.followed_tokens, int64_t(kLag)) << "more than the lag was replayed";
  EXPECT_GE(followed, 5 - int64_t(kLag));
  EXPECT_EQ(parallel::test::read_file(j), parallel::test::read_file(ref))
      << "the followed takeover's batch differs from the uninterrupted run's";
  std::filesystem::remove(ref);
  std::filesystem::remove(j);
}

TEST(RlBelayer, TornLastLineIsIgnoredAndForeignPrefixRefused) {
  const std::string j = temp_path("torn");
  {
    std::ofstream f(j);
    f << "T 100 49;\nT 100 5";  // the kill cut the second line
  }
  JournalState js = JournalState::read(j);
  EXPECT_EQ(js.torn_lines, 1);
  ASSERT_EQ(js.requests.at(100).tokens.size(), 1u);
  // A prefix no run of these weights and seeds would sample is refused, not silently continued.
  {
    std::ofstream f(j);
    f << "T 100 126;\nT 100 126;\nT 100 126;\n";
  }
  auto m = belayer_model();
  RolloutWorker w(*m, sampling(), kMaxNew);
  try {
    w.run(requests(), j);
    FAIL() << "a foreign prefix was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in the log but"), std::string::npos) << e.what();
  }
  std::filesystem::remove(j);
}

// A kill that cuts the journal's last line, then a continuation: the torn line is cut before the
// first append, so the journal ends byte-equal to an uninterrupted one (before the fix the next
// line was glued on, "T 100 4T 100 49;", and read back as a token the run never sampled there).
TEST(RlBelayer, TornLastLineIsCutBeforeTheNextAppend) {
  const std::string ref = temp_path("torn_ref"), j = temp_path("torn_cut");
  std::filesystem::remove(ref);
  std::filesystem::remove(j);
  auto m = belayer_model();
  RolloutWorker w(*m, sampling(), kMaxNew);
  w.run(requests(), ref);
  const std::string full = parallel::test::read_file(ref);
  // Five complete lines, then the sixth cut one character before its ';' (its digits half written).
  size_t at = 0;
  for (int i = 0; i < 5; ++i) at = full.find('\n', at) + 1;
  const size_t semi = full.find(';', at);
  ASSERT_NE(semi, std::string::npos);
  ASSERT_GT(semi - at, 4u) << "the sixth line is too short to tear";
  {
    std::ofstream f(j, std::ios::binary);
    f << full.substr(0, semi - 1);
  }
  EXPECT_EQ(JournalState::read(j).torn_lines, 1);
  const WorkerStats st = w.run(requests(), j);
  EXPECT_GT(st.resumed + st.skipped, 0);
  EXPECT_EQ(parallel::test::read_file(j), full) << "the continued journal differs from an uninterrupted one";
  const JournalState a = JournalState::read(ref), b = JournalState::read(j);
  EXPECT_EQ(b.torn_lines, 0);
  ASSERT_EQ(a.requests.size(), b.requests.size());
  for (const auto& [id, e] : a.requests) EXPECT_EQ(b.requests.at(id).tokens, e.tokens) << "request " << id;
  // A line with anything after its fields is refused, never read as its first token.
  {
    std::ofstream f(j, std::ios::binary);
    f << "T 100 4T 100 49;\n";
  }
  try {
    JournalState::read(j);
    ADD_FAILURE() << "a glued line was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad line"), std::string::npos) << e.what();
  }
  std::filesystem::remove(ref);
  std::filesystem::remove(j);
}

}  // namespace
}  // namespace atl::rl
