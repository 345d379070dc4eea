// The sandbox environment (rl/sandbox.h): a restored sandbox equals the checkpointed one byte for
// byte (and restoring rolls later actions back); a command that runs too long, writes outside its
// directory or crashes gives reward 0 and a logged reason, never throws, and leaves files outside
// the sandbox untouched; a correct answer gives reward 1; "sandbox_add" scores action scripts.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "rl/sandbox.h"

namespace fs = std::filesystem;

namespace atl::rl {
namespace {

struct SandboxTest : ::testing::Test {
  fs::path base;
  void SetUp() override {
    base = fs::temp_directory_path() / ("atoll_sandbox_test_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(base);
    fs::create_directories(base);
    // A file outside the sandbox the commands and writes aim at.
    std::ofstream(base / "outside.txt") << "precious";
  }
  void TearDown() override { fs::remove_all(base); }
  std::string outside() const { return std::ifstream(base / "outside.txt").good() ? read(base / "outside.txt") : "<gone>"; }
  static std::string read(const fs::path& p) {
    std::ifstream f(p);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  std::string dir() const { return (base / "ep").string(); }
  static Problem problem() { return {"12+34=", "46"}; }
  static std::map<std::string, std::vector<std::string>> commands(const std::string& outside_path) {
    // Programs the environment offers by name (fixed argv; the model appends arguments only).
    return {{"spin", {"/bin/sh", "-c", "while :; do :; done"}},
            {"sleep", {"/bin/sleep", "30"}},
            {"segv", {"/bin/sh", "-c", "kill -SEGV $$"}},
            {"fail", {"/bin/sh", "-c", "exit 3"}},
            {"up", {"/bin/sh", "-c", "echo pwned > ../outside.txt"}},
            {"abs", {"/bin/sh", "-c", "echo pwned > " + outside_path}},
            {"link", {"/bin/ln", "-s", outside_path, "evil"}},
            {"copy", {"/bin/cp"}},
            {"ls", {"/bin/ls"}}};
  }
  static std::vector<int32_t> toks(const std::string& s) {
    std::vector<int32_t> t;
    for (unsigned char c : s) t.push_back(int32_t(c));
    return t;
  }
};

TEST_F(SandboxTest, CorrectAnswerGivesRewardOne) {
  SandboxEpisode ep(dir(), problem(), {}, commands(""));
  ep.feed(toks("write answer.txt 46;run ls;check\n"));
  ASSERT_TRUE(ep.done());
  EXPECT_EQ(ep.reward(), 1.0);
  EXPECT_EQ(ep.reason(), "correct");
  ASSERT_EQ(ep.log().size(), 3u);
  EXPECT_EQ(ep.log()[1].result, "ok: answer.txt\n");  // the command saw the sandbox as its cwd
}

TEST_F(SandboxTest, WrongOrMissingAnswerGivesZero) {
  SandboxEpisode a(dir(), problem());
  a.feed(toks("write answer.txt 47;check;"));
  EXPECT_EQ(a.reward(), 0.0);
  EXPECT_EQ(a.reason(), "wrong answer '47'");
  SandboxEpisode b(dir(), problem());
  b.feed(toks("check;"));
  EXPECT_EQ(b.reward(), 0.0);
  EXPECT_EQ(b.reason(), "no answer.txt");
  SandboxEpisode c(dir(), problem());
  EXPECT_EQ(c.act("rm -rf x"), "unknown action 'rm'");
  EXPECT_EQ(c.reward(), 0.0);
  EXPECT_THROW(SandboxEpisode("/", problem()), Error);  // it would be emptied
}

// Timeout: the command spins (and another sleeps) past the wall clock; its group is killed.
TEST_F(SandboxTest, CommandThatRunsTooLongIsKilled) {
  SandboxLimits lim;
  lim.wall_s = 0.5;
  lim.cpu_s = 30;  // the wall clock must be what stops it
  for (const char* cmd : {"spin", "sleep"}) {
    SandboxEpisode ep(dir(), problem(), lim, commands(""));
    const auto t0 = std::chrono::steady_clock::now();
    ep.feed(toks(std::string("write answer.txt 46;run ") + cmd + ";check;"));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(ep.done());
    EXPECT_EQ(ep.reward(), 0.0) << cmd;
    EXPECT_EQ(ep.reason(), "timeout") << cmd;
    EXPECT_LT(s, 10.0) << cmd << ": the command was not killed";
    ASSERT_EQ(ep.log().size(), 2u) << cmd;  // the check after it never ran
    EXPECT_EQ(ep.log().back().result, "timeout") << cmd;
    EXPECT_EQ(ep.act("check"), "ignored: episode over");
  }
  // The CPU rlimit stops a spinner on its own, with its own reason.
  lim.wall_s = 20;
  lim.cpu_s = 1;
  SandboxEpisode ep(dir(), problem(), lim, commands(""));
  ep.act("run spin");
  EXPECT_EQ(ep.reward(), 0.0);
  EXPECT_EQ(ep.reason(), "cpu limit");
}

TEST_F(SandboxTest, CrashingCommandGivesZeroWithReason) {
  SandboxEpisode a(dir(), problem(), {}, commands(""));
  a.feed(toks("write answer.txt 46;run segv;check;"));
  EXPECT_EQ(a.reward(), 0.0);
  EXPECT_EQ(a.reason(), std::string("crash: signal ") + strsignal(SIGSEGV));
  SandboxEpisode b(dir(), problem(), {}, commands(""));
  b.feed(toks("write answer.txt 46;run fail;check;"));
  EXPECT_EQ(b.reward(), 0.0);
  EXPECT_EQ(b.reason(), "exit status 3");
}

TEST_F(SandboxTest, WritesOutsideAreRefusedAndTouchNothing) {
  const std::string out = (base / "outside.txt").string();
  const auto refused = [&](const std::string& script, const std::string& reason_prefix, bool plant_link = false) {
    SandboxEpisode ep(dir(), problem(), {}, commands(out));
    if (plant_link) fs::create_directory_symlink(base, fs::path(dir()) / "up");
    ep.feed(toks(script));
    EXPECT_TRUE(ep.done()) << script;
    EXPECT_EQ(ep.reward(), 0.0) << script;
    EXPECT_TRUE(ep.reason().starts_with(reason_prefix)) << script << " -> " << ep.reason();
    EXPECT_EQ(outside(), "precious") << script;
  };
  refused("write answer.txt 46;write " + out + " pwned;check;", "escape: absolute path");
  refused("write answer.txt 46;write ../outside.txt pwned;check;", "escape: '..'");
  refused("write answer.txt 46;write sub/../../outside.txt pwned;check;", "escape: '..'");
  refused("write answer.txt 46;write up/outside.txt pwned;check;", "escape: symlink up", true);
  // A command run in the sandbox: '..' lands in its private root, caught, never in base/.
  refused("write answer.txt 46;run up;check;", "escape: wrote ../outside.txt");
  // A command that plants a symlink out of the sandbox: not taken back.
  refused("write answer.txt 46;run link;check;", "escape: left symlink evil");
  // A command writing an absolute path is stopped by the read-only mount namespace when the kernel lets us make one.
  if (!sandbox_can_isolate())
    GTEST_SKIP() << "no mount namespace here (needs CAP_SYS_ADMIN): a command's absolute-path write is not "
                    "contained; the path checks and rlimits above hold without it";
  SandboxEpisode ep(dir(), problem(), {}, commands(out));
  ep.feed(toks("write answer.txt 46;run abs;check;"));
  EXPECT_EQ(ep.reward(), 0.0);
  EXPECT_TRUE(ep.reason().starts_with("exit status")) << ep.reason();
  EXPECT_NE(ep.log()[1].result.find("Read-only file system"), std::string::npos) << ep.log()[1].result;
  EXPECT_EQ(outside(), "precious");
  // Without the namespace the same command gets through: the namespace is what stops it.
  SandboxLimits open;
  open.isolate = false;
  SandboxEpisode leaky(dir(), problem(), open, commands(out));
  leaky.feed(toks("write answer.txt 46;run abs;check;"));
  EXPECT_EQ(outside(), "pwned\n");
}

TEST_F(SandboxTest, FileSizeLimitStopsACommand) {
  SandboxLimits lim;
  lim.file_bytes = 1000;
  SandboxEpisode ep(dir(), problem(), lim, {{"big", {"/bin/dd", "if=/dev/zero", "of=big.bin", "bs=1000", "count=100"}}});
  ep.act("run big");
  EXPECT_EQ(ep.reward(), 0.0);
  EXPECT_EQ(ep.reason(), "file size limit");
  EXPECT_FALSE(fs::exists(fs::path(dir()) / "big.bin"));  // a failed run's files are not taken back
}

TEST_F(SandboxTest, RestoredSandboxEqualsCheckpointByteForByte) {
  SandboxEpisode ep(dir(), problem(), {}, commands(""));
  std::string bin;
  for (int i = 0; i < 256; ++i) bin += char(i);
  ep.feed(toks("write notes/a.txt first;write b.txt second;"));
  {
    std::ofstream(fs::path(dir()) / "notes" / "bin.dat", std::ios::binary) << bin;  // every byte value
  }
  ep.feed(toks("run copy b.txt c.txt;write answer"));  // a pending, half-written action
  const auto want = read_tree(dir());
  ASSERT_EQ(want.size(), 5u);  // notes/, notes/a.txt, notes/bin.dat, b.txt, c.txt
  EXPECT_EQ(want.at("c.txt"), "second");
  SandboxCheckpoint ck = ep.checkpoint();
  const std::string path = (base / "ck.bin").string();
  ck.save(path);

  // Further actions change the tree; restoring rolls them back, through the file on disk too.
  ep.feed(toks(".txt 46;write b.txt changed;run copy notes/a.txt d.txt;"));
  EXPECT_NE(read_tree(dir()), want);
  EXPECT_EQ(ep.log().size(), 6u);
  ep.restore(SandboxCheckpoint::load(path));
  EXPECT_EQ(read_tree(dir()), want);
  EXPECT_EQ(read_tree(dir()).at("notes/bin.dat"), bin);
  const uint64_t fp = sandbox_fingerprint(dir());
  std::ofstream(fs::path(dir()) / "b.txt", std::ios::app) << "x";
  EXPECT_NE(sandbox_fingerprint(dir()), fp);  // one byte changes it
  ep.restore(ck);
  EXPECT_EQ(sandbox_fingerprint(dir()), fp);
  EXPECT_EQ(ep.log().size(), 3u);
  EXPECT_EQ(ep.context(), ck.context);

  // A restored episode continues consistently with the model context: resuming from a journal
  // prefix that goes past the checkpoint replays the tokens after it; the result equals an
  // uninterrupted episode's, file for file and reward for reward.
  const std::string rest = ".txt 46;check;";
  std::vector<int32_t> journal = ck.context;
  for (int32_t t : toks(rest)) journal.push_back(t);
  ep.restore(ck, journal);
  EXPECT_TRUE(ep.done());
  EXPECT_EQ(ep.reward(), 1.0);
  EXPECT_EQ(ep.log().back().action, "check");
  EXPECT_EQ(ep.log()[3].action, "write answer.txt 46");
  SandboxEpisode fresh(dir() + "2", problem(), {}, commands(""));
  fresh.feed(toks("write notes/a.txt first;write b.txt second;"));
  {
    std::ofstream(fs::path(dir() + "2") / "notes" / "bin.dat", std::ios::binary) << bin;  // as above
  }
  fresh.feed(toks("run copy b.txt c.txt;write answer" + rest));
  EXPECT_EQ(read_tree(dir()), read_tree(dir() + "2"));
  EXPECT_EQ(fresh.reward(), ep.reward());
  EXPECT_EQ(fresh.context(), ep.context());
  ASSERT_EQ(fresh.log().size(), ep.log().size());
  for (size_t i = 0; i < ep.log().size(); ++i) {
    EXPECT_EQ(fresh.log()[i].action, ep.log()[i].action);
    EXPECT_EQ(fresh.log()[i].context_len, ep.log()[i].context_len);
  }
  // A journal that disagrees with the checkpoint's context is refused with a clear error.
  std::vector<int32_t> other = toks("write x.txt 1;");
  EXPECT_THROW(ep.restore(ck, other), Error);
}

TEST(RlSandboxTask, ScoresActionScripts) {
  TaskSpec s;
  s.name = "sandbox_add";
  auto t = make_verifiable_task(s);
  Rng rng(5, 0);
  const Problem p = t->draw(rng);
  int a = 0, b = 0;
  ASSERT_EQ(std::sscanf(p.prompt.c_str(), "%d+%d=", &a, &b), 2) << p.prompt;
  const std::string sum = std::to_string(a + b);
  EXPECT_EQ(p.answer, "write answer.txt " + sum + ";check");  // the reference script (SFT target)
  EXPECT_EQ(t->score(p, p.answer, true, 0.0).exact, 1.0);
  // Cut off before the end marker: the last action never completed, so the check did not run.
  EXPECT_EQ(t->score(p, "write answer.txt " + sum + ";check", false, 0.0).exact, 0.0);
  EXPECT_EQ(t->score(p, "write answer.txt " + sum, true, 0.0).total, 0.0);  // no check
  EXPECT_EQ(t->score(p, "write ../answer.txt " + sum + ";check", true, 0.5).total, 0.0);
  const Reward w = t->score(p, "write answer.txt 0;check", true, 0.5);
  EXPECT_EQ(w.exact, 0.0);
  EXPECT_EQ(w.format, 1.0);
}

}  // namespace
}  // namespace atl::rl
