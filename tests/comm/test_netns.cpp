// A real multi-node `atoll launch`: two hosts made of network namespaces joined by rate-limited
// veth links (scripts/netns_testbed.sh), two ranks each, one all_reduce checked on every rank.
// Skipped, with the script's reason, where the machine cannot create namespaces.
#include <gtest/gtest.h>

#include "comm_test_util.h"

using namespace atl::comm::test;

TEST(NetnsTestbed, TwoHostLaunchAcrossRateLimitedLinks) {
  std::string cmd = fmt::format(
      "'{}' launch --nnodes $NHOSTS --node-rank $HOST_INDEX --nproc-per-node 2 --rdzv $HOST0_ADDR:29400 "
      "--timeout 20 -- '{}' --worker hosts",
      atoll_exe(), self_exe());
  Proc p = run({std::string(ATOLL_SOURCE_DIR) + "/scripts/netns_testbed.sh", "--hosts", "2", "--rate", "200mbit",
                "--", cmd},
               60);
  if (p.exit_code() == 77) GTEST_SKIP() << p.out;
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_EQ(p.exit_code(), 0) << p.out;
  // Host 0 runs ranks 0 and 1, host 1 ranks 2 and 3, all in one 4-rank job.
  EXPECT_EQ(count_of(p.out, "[host 0] [rank 0] hosts ok: rank 0 of 4, sum 10"), 1) << p.out;
  EXPECT_EQ(count_of(p.out, "[host 0] [rank 1] hosts ok: rank 1 of 4, sum 10"), 1) << p.out;
  EXPECT_EQ(count_of(p.out, "[host 1] [rank 2] hosts ok: rank 2 of 4, sum 10"), 1) << p.out;
  EXPECT_EQ(count_of(p.out, "[host 1] [rank 3] hosts ok: rank 3 of 4, sum 10"), 1) << p.out;
}

// A failure on one host tears down the job on the other host too (through the store).
TEST(NetnsTestbed, FailureOnOneHostStopsTheOther) {
  std::string cmd = fmt::format(
      "'{}' launch --nnodes $NHOSTS --node-rank $HOST_INDEX --nproc-per-node 1 --rdzv $HOST0_ADDR:29400 "
      "--grace 1 -- sh -c 'if [ $RANK = 1 ]; then sleep 0.5; exit 5; fi; sleep 60'",
      atoll_exe());
  Proc p = run({std::string(ATOLL_SOURCE_DIR) + "/scripts/netns_testbed.sh", "--hosts", "2", "--rate", "none", "--", cmd},
               40);
  if (p.exit_code() == 77) GTEST_SKIP() << p.out;
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_NE(p.exit_code(), 0) << p.out;
  EXPECT_LT(p.seconds, 20) << p.out;
  EXPECT_NE(p.out.find("[host 1] atoll launch: job failed: rank 1 (pid"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("[host 0] atoll launch: job failed: rank 1 (pid"), std::string::npos) << p.out;
}
