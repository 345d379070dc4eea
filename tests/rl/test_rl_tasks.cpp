// The verifiable tasks: exact and format rewards (each can fail), the held-out split, the word
// task over the Debian word list, the char vocabulary.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "core/error.h"
#include "rl/verifiable_task.h"

namespace atl::rl {
namespace {

std::unique_ptr<VerifiableTask> task(const std::string& name, int64_t digits = 2) {
  TaskSpec s;
  s.name = name;
  s.digits = digits;
  return make_verifiable_task(s);
}

TEST(RlTasks, AdditionProblemsAreCorrectAndTwoDigit) {
  auto t = task("add");
  Rng rng(3, 0);
  for (int i = 0; i < 200; ++i) {
    Problem p = t->draw(rng);
    int a = 0, b = 0;
    ASSERT_EQ(std::sscanf(p.prompt.c_str(), "%d+%d=", &a, &b), 2) << p.prompt;
    EXPECT_GE(a, 10);
    EXPECT_LE(a, 99);
    EXPECT_GE(b, 10);
    EXPECT_EQ(p.answer, std::to_string(a + b));
    EXPECT_EQ(p.prompt.back(), '=');
  }
}

TEST(RlTasks, MultiplicationAnswers) {
  auto t = task("mul", 3);
  Rng rng(4, 0);
  Problem p = t->draw(rng);
  int a = 0, b = 0;
  ASSERT_EQ(std::sscanf(p.prompt.c_str(), "%d*%d=", &a, &b), 2) << p.prompt;
  EXPECT_GE(a, 100);
  EXPECT_EQ(p.answer, std::to_string(int64_t(a) * b));
  EXPECT_LE(int64_t(p.answer.size()), t->max_answer_len());
}

TEST(RlTasks, ExactAndFormatRewardsCanFail) {
  auto t = task("add");
  Problem p{"12+34=", "46"};
  Reward ok = t->score(p, "46", true, 0.1);
  EXPECT_EQ(ok.exact, 1);
  EXPECT_EQ(ok.format, 1);
  EXPECT_DOUBLE_EQ(ok.total, 1.1);
  Reward wrong = t->score(p, "47", true, 0.1);  // well formed, wrong
  EXPECT_EQ(wrong.exact, 0);
  EXPECT_EQ(wrong.format, 1);
  EXPECT_DOUBLE_EQ(wrong.total, 0.1);
  Reward unstopped = t->score(p, "46", false, 0.1);  // right digits, no end marker
  EXPECT_EQ(unstopped.exact, 0);
  EXPECT_EQ(unstopped.format, 0);
  EXPECT_EQ(t->score(p, "4a", true, 0.1).format, 0);     // outside the alphabet
  EXPECT_EQ(t->score(p, "", true, 0.1).format, 0);       // empty
  EXPECT_EQ(t->score(p, "4600", true, 0.1).format, 0);   // longer than any sum of two 2-digit numbers
  EXPECT_EQ(t->score(p, " 46", true, 0.1).exact, 0);
}

TEST(RlTasks, HeldOutSetIsDisjointFromTrainingPrompts) {
  for (const char* name : {"add", "reverse"}) {
    auto t = task(name);
    std::vector<Problem> ev = t->eval_set(200, 20240601);
    ASSERT_EQ(ev.size(), 200u) << name;
    std::set<std::string> eval_prompts;
    for (auto& p : ev) {
      EXPECT_TRUE(t->held_out(p.prompt));
      eval_prompts.insert(p.prompt);
    }
    EXPECT_EQ(eval_prompts.size(), ev.size()) << "duplicates in the held-out set";
    Rng rng(99, 1);
    int seen_train = 0;
    for (int i = 0; i < 20000; ++i) {
      Problem p = t->draw_train(rng);
      ASSERT_EQ(eval_prompts.count(p.prompt), 0u) << name << ": training prompt " << p.prompt << " is held out";
      ++seen_train;
    }
    EXPECT_EQ(seen_train, 20000);
    // The split is ~heldout_percent of the space: the raw draws hit it sometimes.
    int held = 0;
    for (int i = 0; i < 5000; ++i) held += t->held_out(t->draw(rng).prompt);
    EXPECT_GT(held, 250) << name;
    EXPECT_LT(held, 750) << name;
  }
}

TEST(RlTasks, WordTasksFromTheDebianWordList) {
  if (!std::filesystem::exists("/usr/share/dict/words"))
    GTEST_SKIP() << "/usr/share/dict/words is missing (Debian package wamerican; scripts/setup.sh installs it)";
  auto rev = task("reverse"), srt = task("sort");
  Rng rng(5, 0);
  for (int i = 0; i < 50; ++i) {
    Problem p = rev->draw(rng);
    ASSERT_EQ(p.prompt.rfind("rev:", 0), 0u);
    std::string w = p.prompt.substr(4, p.prompt.size() - 5);
    EXPECT_EQ(p.answer, std::string(w.rbegin(), w.rend()));
    EXPECT_GE(w.size(), 3u);
    EXPECT_LE(w.size(), 6u);
    Problem q = srt->draw(rng);
    EXPECT_TRUE(std::is_sorted(q.answer.begin(), q.answer.end())) << q.answer;
  }
  EXPECT_EQ(rev->score({"rev:cat=", "tac"}, "tac", true, 0.1).exact, 1);
  EXPECT_EQ(rev->score({"rev:cat=", "tac"}, "tca", true, 0.1).exact, 0);
  EXPECT_EQ(rev->score({"rev:cat=", "tac"}, "t4c", true, 0.1).format, 0);
  TaskSpec bad;
  bad.name = "reverse";
  bad.words_file = "/nonexistent/words";
  try {
    make_verifiable_task(bad);
    FAIL() << "a missing word list must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wamerican"), std::string::npos) << e.what();
  }
}

TEST(RlTasks, CharVocabularyRoundTrips) {
  std::vector<int32_t> ids = encode("12+34=");
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_EQ(decode(ids), "12+34=");
  EXPECT_EQ(decode({kEndMarker}), "?");
  EXPECT_THROW(encode("a\tb"), Error);
  for (int32_t t : encode("~ az09")) EXPECT_LT(t, kVocab);
}

TEST(RlTasks, UnknownTaskNamesTheKey) {
  TaskSpec s;
  s.name = "ad";
  try {
    make_verifiable_task(s);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rl.task"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("add"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace atl::rl
