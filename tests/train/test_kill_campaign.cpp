// Issue 10: the kill -9 campaign (tools/kill_campaign.sh) in small: 5 random SIGKILLs of a
// 1-rank trainer that checkpoints every step; every resume starts from a complete checkpoint,
// never behind the previous one, and the final state is bit-exact with an uninterrupted run.
// The full campaign (50 trainer kills and 20 launcher kills, 1 and 2 ranks) is run by hand.
#include <gtest/gtest.h>

#include "trainer_fixture.h"

using namespace atl::test;

TEST(KillCampaign, FiveKillsOfTheTrainerResumeBitExactly) {
  fs::path w = scratch("kill_campaign");
  CmdResult r = run_shell(fmt::format("bash '{}/tools/kill_campaign.sh' --atoll '{}' --ranks 1 --kills 5 --steps 12 "
                                      "--max-delay 0.6 --seed 3 --work '{}'",
                                      ATOLL_SOURCE_DIR, atoll_exe(), w.string()));
  EXPECT_EQ(r.exit_code(), 0) << r.out;
  EXPECT_TRUE(contains(r.out, "5 trainer kills")) << r.out;
  EXPECT_TRUE(contains(r.out, "0 went backwards, 0 skipped a bad checkpoint")) << r.out;
  size_t at = r.out.find("bit-exact runs: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  std::string frac = r.out.substr(at + 16, r.out.find(';', at) - at - 16);
  size_t slash = frac.find('/');
  ASSERT_NE(slash, std::string::npos) << frac;
  EXPECT_EQ(frac.substr(0, slash), frac.substr(slash + 1)) << r.out;
  EXPECT_NE(frac.substr(0, slash), "0") << r.out;
  fs::remove_all(w);
}
