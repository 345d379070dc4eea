// The fault-injection campaign (campaign_toy.h, resilience/fault_campaign.h): the 21 fault types of
// the lm-resiliency catalog, each really injected at a step boundary on the rank the seeded
// campaign file draws, in one job of 4 ranks that restarts from its checkpoints after the fatal
// ones; localized to exactly the injected rank on 4 ranks, inconclusive (never a wrong rank) on 2
// wherever a vote localizes, and no detection at all in a clean run of 500 steps.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "campaign_toy.h"
#include "proc.h"
#include "resilience/fault_campaign.h"

namespace atl::resilience::test {
namespace {

namespace fs = std::filesystem;

const std::string kCampaign = std::string(ATOLL_SOURCE_DIR) + "/tests/resilience/campaign_21.json";

std::string workdir(const std::string& name) {
  return (fs::temp_directory_path() / ("atoll_campaign_" + name + std::to_string(::getpid()))).string();
}

std::string table(const CampaignRun& run) { return format_score(run.campaign, run.score) + "problem: " + run.problem; }

}  // namespace

TEST(FaultCampaign, FourRanksLocalizeEachOfThe21FaultTypesToExactlyTheInjectedRank) {
  std::string dir = workdir("four");
  CampaignRun run = run_campaign(kCampaign, 4, dir);
  std::printf("%s%d segments, %.1f s\n", format_score(run.campaign, run.score).c_str(), run.segments, run.seconds);
  ASSERT_TRUE(run.completed) << table(run);
  ASSERT_EQ(run.campaign.faults.size(), fault_catalog().size());
  for (auto& f : run.score.faults) EXPECT_EQ(f.outcome, "exact") << f.fault.type << " at step " << f.fault.step;
  EXPECT_EQ(run.score.exact, 21) << table(run);
  EXPECT_TRUE(run.score.false_positives.empty()) << table(run);
  // One restart per fatal fault, no more: every other fault was repaired in place.
  int fatal = 0;
  for (auto& t : fault_catalog()) fatal += t.fatal;
  EXPECT_EQ(run.segments, 1 + fatal);
  fs::remove_all(dir);
}

TEST(FaultCampaign, TwoRanksAreInconclusiveWhereAVoteLocalizesAndNeverNameAWrongRank) {
  std::string dir = workdir("two");
  CampaignRun run = run_campaign(kCampaign, 2, dir);
  std::printf("%s%d segments, %.1f s\n", format_score(run.campaign, run.score).c_str(), run.segments, run.seconds);
  ASSERT_TRUE(run.completed) << table(run);
  for (auto& f : run.score.faults) {
    // A vote of 2 has no strict majority; evidence about one rank alone (its exit status, its
    // stopped heartbeats, its own checkpoint) needs none.
    const char* want = fault_type(f.fault.type).by_vote ? "inconclusive" : "exact";
    EXPECT_EQ(f.outcome, want) << f.fault.type << " at step " << f.fault.step;
    for (auto& d : f.detections)
      if (fault_type(f.fault.type).by_vote) {
        EXPECT_TRUE(d.where.ranks.empty()) << f.fault.type << ": " << d.detector;
      }
  }
  EXPECT_EQ(run.score.wrong, 0) << table(run);
  EXPECT_EQ(run.score.missed, 0) << table(run);
  EXPECT_TRUE(run.score.false_positives.empty()) << table(run);
  fs::remove_all(dir);
}

TEST(FaultCampaign, ACleanRunOf500StepsDetectsNothing) {
  std::string dir = workdir("clean");
  fs::create_directories(dir + ".cfg");
  std::string path = dir + ".cfg/clean.json";
  std::ofstream(path) << R"({"seed": 1, "steps": 500, "checkpoint_every": 25, "faults": []})";
  CampaignRun run = run_campaign(path, 4, dir);
  std::printf("clean run: %zu detections, %d segments, %.1f s\n", run.detections.size(), run.segments, run.seconds);
  ASSERT_TRUE(run.completed) << run.problem;
  EXPECT_EQ(run.segments, 1);
  for (auto& d : run.detections)
    ADD_FAILURE() << "step " << d.step << ": " << d.detector << " " << verdict_name(d.where.verdict) << " " << d.detail;
  fs::remove_all(dir);
  fs::remove_all(dir + ".cfg");
}

TEST(FaultCampaign, TheFileIsSeededAndBadOnesAreRefusedNamingTheFault) {
  std::string text = read_file(kCampaign);
  Campaign a = parse_campaign(text, 4, "a"), b = parse_campaign(text, 4, "b");
  ASSERT_EQ(a.faults.size(), 21u);
  bool differs = false;
  std::string other = text;
  other.replace(other.find("\"seed\": 14"), 10, "\"seed\": 15");
  Campaign c = parse_campaign(other, 4, "c");
  for (size_t i = 0; i < a.faults.size(); ++i) {
    EXPECT_EQ(a.faults[i].ranks, b.faults[i].ranks);
    EXPECT_EQ(a.faults[i].step, b.faults[i].step);
    differs = differs || a.faults[i].ranks != c.faults[i].ranks || a.faults[i].step != c.faults[i].step;
    if (i) {
      EXPECT_GT(a.faults[i].step, a.faults[i - 1].step);
    }
  }
  EXPECT_TRUE(differs) << "another seed should draw other ranks or steps";
  // Every type once, 5 families.
  std::set<std::string> types, families;
  for (auto& f : a.faults) types.insert(f.type);
  for (auto& t : fault_catalog()) families.insert(t.family);
  EXPECT_EQ(types.size(), 21u);
  EXPECT_EQ(families.size(), 5u);
  auto refused = [](const std::string& json, const std::string& needle) {
    try {
      parse_campaign(json, 4, "bad.json");
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted: " << json;
  };
  refused(R"({"faults": ["hang"], "sede": 3})", "unknown key 'sede'");
  refused(R"({"faults": ["hang", "bitrot"]})", "unknown fault type 'bitrot'");
  refused(R"({"faults": [{"type": "hang", "rank": 4}]})", "fault 0 (hang): rank 4 is outside a world of 4");
  refused(R"({"faults": [{"type": "hang", "step": 30}, {"type": "delay", "step": 30}]})", "fault 1 (delay): step 30");
  refused(R"({"faults": [{"type": "hang", "when": 3}]})", "fault 0: unknown key 'when'");
  refused(R"({"faults": [{"type": "checkpoint_missing", "step": 5}]})", "before the first checkpoint");
  refused(R"({"faults": []})", "needs 'steps'");
}

TEST(FaultCampaign, TheScorerWantsTheExactRankSetAndCountsAnExtraRankAsAnError) {
  Campaign c = parse_campaign(
      R"({"faults": [{"type": "delay", "rank": 2, "step": 20}, {"type": "drop", "rank": 1, "step": 30},
                     {"type": "hang", "rank": 3, "step": 40}, {"type": "exception", "rank": 0, "step": 50}]})",
      4, "t");
  auto det = [](int64_t step, Localization::Verdict v, std::vector<int> r) {
    Detection d;
    d.step = step;
    d.detector = "x";
    d.where.verdict = v;
    d.where.ranks = r;
    return d;
  };
  CampaignScore s = score_campaign(c, {det(20, Localization::outlier, {2}), det(31, Localization::outlier, {1, 2}),
                                       det(41, Localization::inconclusive, {}), det(45, Localization::outlier, {3})});
  EXPECT_EQ(s.faults[0].outcome, "exact");
  EXPECT_EQ(s.faults[1].outcome, "wrong");  // an extra rank
  EXPECT_EQ(s.faults[2].outcome, "inconclusive");
  EXPECT_EQ(s.faults[3].outcome, "missed");
  ASSERT_EQ(s.false_positives.size(), 1u);  // step 45 is in no fault's window
  EXPECT_EQ(s.false_positives[0].step, 45);
  // The votes themselves.
  EXPECT_EQ(localize_by_majority({"a", "a", "b", "a"}).ranks, std::vector<int>{2});
  EXPECT_EQ(localize_by_majority({"a", "b"}).verdict, Localization::inconclusive);
  EXPECT_EQ(localize_by_majority({"a", "a", "b", "b"}).verdict, Localization::inconclusive);
  EXPECT_EQ(localize_by_accusations({{2}, {2}, {0}, {2}}).ranks, std::vector<int>{2});
  EXPECT_EQ(localize_by_accusations({{1}, {0}}).verdict, Localization::inconclusive);
  EXPECT_EQ(localize_by_accusations({{}, {}, {}}).verdict, Localization::clean);
}

}  // namespace atl::resilience::test
