// Ranks started without `atoll launch` (any torchrun-style launcher): rank 0 hosts the store.
#include <gtest/gtest.h>

#include "comm/tcp_store.h"
#include "comm_test_util.h"

using namespace atl::comm::test;

namespace {
// Starts 3 ranks of `test_comm --worker ARGS` with only RANK/WORLD_SIZE/MASTER_* set and prints
// each rank's exit status as "status R S".
Proc run_three(const std::string& args, double timeout_s) {
  int port = atl::comm::pick_free_port();
  std::string script = fmt::format(
      "for r in 0 1 2; do RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT={} ATOLL_COMM_TIMEOUT={} "
      "'{}' --worker {} & eval p$r=$!; done; "
      "for r in 0 1 2; do eval wait \\$p$r; echo status $r $?; done",
      port, timeout_s, self_exe(), args);
  return run({"sh", "-c", script}, 60);
}
}  // namespace

TEST(RankZeroStore, CollectivesWithoutALauncher) {
  Proc p = run_three("suite gloo", 20);
  EXPECT_FALSE(p.timed_out) << p.out;
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(count_of(p.out, fmt::format("status {} 0\n", r)), 1) << p.out;
    EXPECT_EQ(count_of(p.out, fmt::format("suite ok: rank {} of 3 on gloo", r)), 1) << p.out;
  }
}

// Killing rank 0 also kills the store: the others must still fail promptly, and say so.
TEST(RankZeroStore, KilledStoreHostIsReported) {
  Proc p = run_three("fault 0 kill 20", 8);
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_LT(p.seconds, 13) << p.out;
  EXPECT_EQ(count_of(p.out, "status 0 137\n"), 1) << p.out;
  for (int r : {1, 2}) {
    EXPECT_EQ(count_of(p.out, fmt::format("status {} 3\n", r)), 1) << p.out;
    EXPECT_EQ(count_of(p.out, fmt::format("worker error: all_reduce #21 on gloo rank {} (of 3) failed: ", r)), 1) << p.out;
  }
  EXPECT_EQ(count_of(p.out, "rank 0, which hosts the store, has probably died"), 2) << p.out;
}

// WORLD_SIZE=3 but only ranks 0 and 1 start: both fail at rendezvous naming rank 2.
TEST(RankZeroStore, RankThatNeverJoinsIsNamed) {
  int port = atl::comm::pick_free_port();
  std::string script = fmt::format(
      "for r in 0 1; do RANK=$r WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT={} ATOLL_COMM_TIMEOUT=1.5 "
      "'{}' --worker hosts & eval p$r=$!; done; for r in 0 1; do eval wait \\$p$r; echo status $r $?; done",
      port, self_exe());
  Proc p = run({"sh", "-c", script}, 30);
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_LT(p.seconds, 8) << p.out;
  for (int r : {0, 1}) {
    EXPECT_EQ(count_of(p.out, fmt::format("status {} 3\n", r)), 1) << p.out;
    EXPECT_EQ(count_of(p.out, fmt::format("gloo rendezvous of rank {} of 3 failed (rank 2 never joined)", r)), 1)
        << p.out;
  }
}
