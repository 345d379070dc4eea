// NCCL backend: without a GPU, asking for it fails with a reason (runs everywhere); with one GPU,
// a one-rank NCCL world runs every collective; with two GPUs, two processes (this binary, re-run
// as rank programs) pass the same collective checks as every other backend
// (tests/comm/collective_checks.cpp: serial CPU reference, every dtype, split, send/recv).
// NCCL does not allow two ranks of one communicator on the same GPU, so the two-rank test needs
// two GPUs and skips, saying so, with fewer.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "comm_test_util.h"
#ifdef ATOLL_HAVE_CUDA
#include "kernels/cuda/device.h"
#endif

using namespace atl;
using namespace atl::comm;

namespace {

int visible_devices(std::string* reason) {
#ifdef ATOLL_HAVE_CUDA
  auto q = cuda::query_devices();
  *reason = q.reason;
  return q.count;
#else
  *reason = "atoll was built without the CUDA toolkit";
  return 0;
#endif
}

bool launched_as_rank() { return std::getenv("ATOLL_NCCL_TEST_RANK") != nullptr; }

}  // namespace

TEST(NcclBackend, FailsSayingWhyWithoutGpuElseRunsOneRank) {
  if (launched_as_rank()) GTEST_SKIP() << "inside a rank program of NcclTwoRanks";
  std::string reason;
  int n = visible_devices(&reason);
#ifndef ATOLL_HAVE_NCCL
  (void)n;
  try {
    make_communicator("nccl", Millis(10000));
    ADD_FAILURE() << "backend 'nccl' was created in a build without NCCL";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without NCCL"), std::string::npos) << e.what();
  }
#else
  if (n == 0) {
    try {
      make_communicator("nccl", Millis(10000));
      ADD_FAILURE() << "backend 'nccl' was created with no CUDA device visible";
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("needs a CUDA device"), std::string::npos) << msg;
      EXPECT_NE(msg.find(reason), std::string::npos) << "the runtime's reason is missing: " << msg;
    }
  } else {
    auto c = make_communicator("nccl", Millis(60000));
    ASSERT_EQ(c->backend(), "nccl");
    ASSERT_EQ(c->size(), 1);
    EXPECT_GT(test::check_all_collectives(*c), 0);
  }
#endif
}

TEST(NcclBackend, AutoKeepsGlooOrSingleOnTheCpu) {
  if (launched_as_rank()) GTEST_SKIP() << "inside a rank program of NcclTwoRanks";
  auto c = make_communicator("auto", Millis(10000));
  EXPECT_EQ(c->backend(), "single");  // WORLD_SIZE unset: one process, never NCCL by default
}

// The rank side of NcclTwoRanks (started by it with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*).
TEST(NcclTwoRanks, RankProgram) {
  if (!launched_as_rank()) GTEST_SKIP() << "rank program of NcclTwoRanks.EveryCollectiveMatchesCpuReference; runs only when started by it";
  auto c = make_communicator("nccl", Millis(60000));
  ASSERT_EQ(c->backend(), "nccl");
  ASSERT_EQ(c->size(), 2);
  int checks = test::check_all_collectives(*c);
  EXPECT_GT(checks, 0);
  std::printf("rank %d: %d checks passed\n", c->rank(), checks);
}

TEST(NcclTwoRanks, EveryCollectiveMatchesCpuReference) {
  if (launched_as_rank()) GTEST_SKIP() << "inside a rank program";
  std::string reason;
  int n = visible_devices(&reason);
#ifndef ATOLL_HAVE_NCCL
  GTEST_SKIP() << "atoll was built without NCCL";
#endif
  if (n == 0) GTEST_SKIP() << "no CUDA device visible: " << reason;
  if (n < 2)
    GTEST_SKIP() << "NCCL needs one GPU per rank and this test runs 2 ranks; only " << n
                 << " CUDA device visible";
  int port = pick_free_port();
  std::string self = test::self_exe();
  std::vector<std::string> common = {"WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                     "MASTER_PORT=" + std::to_string(port)};
  std::vector<std::thread> ranks;
  std::vector<test::Proc> res(2);
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> env = common;
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("ATOLL_NCCL_TEST_RANK=" + std::to_string(r));
    ranks.emplace_back([&, r, env] {
      res[size_t(r)] = test::run({self, "--gtest_filter=NcclTwoRanks.RankProgram"}, 240, env);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(res[size_t(r)].timed_out) << "rank " << r << " timed out:\n" << res[size_t(r)].out;
    EXPECT_EQ(res[size_t(r)].exit_code(), 0) << "rank " << r << ":\n" << res[size_t(r)].out;
    EXPECT_NE(res[size_t(r)].out.find("checks passed"), std::string::npos) << res[size_t(r)].out;
  }
}
