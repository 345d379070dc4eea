// Checkpoints hold full weights and full optimizer state, so a run saved under ZeRO-3 on 2 ranks
// resumes on 1 rank under DDP and the other way round, ending where an uninterrupted run ends.
#include <gtest/gtest.h>
#include <unistd.h>

#include "core/threads.h"
#include "harness.h"

using namespace atl;
using namespace atl::parallel::test;

namespace {
std::string tmp(const std::string& name) { return "/tmp/atoll_ckpt_" + std::to_string(getpid()) + "_" + name; }

std::vector<float> uninterrupted() {
  set_num_threads(1);
  Job j;
  j.batch = 4;
  j.steps = 4;
  return run_job(nullptr, j);
}
}  // namespace

TEST(Reshard, Zero3TwoRanksToDDPOneRank) {
  std::string ck = tmp("z3.safetensors");
  Job a;
  a.strategy = "zero3";
  a.batch = 2;
  a.steps = 2;
  a.save = ck;
  ASSERT_FALSE(run_ranks(2, a).empty());
  set_num_threads(1);
  Job b;
  b.batch = 4;
  b.start_step = 2;
  b.steps = 2;
  b.load = ck;
  std::vector<float> resumed = run_job(nullptr, b);
  std::remove(ck.c_str());
  EXPECT_LT(rel_diff(resumed, uninterrupted()), 1e-6);
}

TEST(Reshard, DDPOneRankToZero3TwoRanks) {
  std::string ck = tmp("ddp.safetensors");
  set_num_threads(1);
  Job a;
  a.batch = 4;
  a.steps = 2;
  a.save = ck;
  run_job(nullptr, a);
  std::vector<float> ref = uninterrupted();
  Job b;
  b.strategy = "zero3";
  b.batch = 2;
  b.start_step = 2;
  b.steps = 2;
  b.load = ck;
  std::vector<float> resumed = run_ranks(2, b);
  ASSERT_FALSE(resumed.empty());
  EXPECT_LT(rel_diff(resumed, ref), 1e-6);
  std::remove(ck.c_str());
}
