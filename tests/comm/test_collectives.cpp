// Every collective on Gloo (ranks started by `atoll launch`) and MPI (ranks started by mpirun),
// for 2, 3 and 4 ranks, against the serial reference in collective_checks.cpp.
#include <gtest/gtest.h>

#include "comm/mpi_communicator.h"
#include "comm_test_util.h"

using namespace atl::comm::test;

namespace {

void expect_suite_passed(const Proc& p, int n, const std::string& backend) {
  EXPECT_FALSE(p.timed_out) << p.out;
  EXPECT_EQ(p.exit_code(), 0) << p.out;
  EXPECT_EQ(count_of(p.out, "suite ok:"), n) << p.out;
  EXPECT_EQ(count_of(p.out, "on " + backend + ","), n) << p.out;
}

}  // namespace

class GlooCollectives : public testing::TestWithParam<int> {};

TEST_P(GlooCollectives, MatchSerialReference) {
  int n = GetParam();
  Proc p = run({atoll_exe(), "launch", "--nproc-per-node", std::to_string(n), "--timeout", "20", "--",
                self_exe(), "--worker", "suite", "gloo"},
               60);
  expect_suite_passed(p, n, "gloo");
  for (int r = 0; r < n; ++r) EXPECT_EQ(count_of(p.out, "[rank " + std::to_string(r) + "] suite ok"), 1) << p.out;
}
INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectives, testing::Values(2, 3, 4));

#ifdef ATOLL_HAVE_MPI
class MpiCollectives : public testing::TestWithParam<int> {};

TEST_P(MpiCollectives, MatchSerialReference) {
  int n = GetParam();
  Proc p = run({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(n), "-x",
                "ATOLL_COMM_TIMEOUT=20", self_exe(), "--worker", "suite", "auto"},
               60, {"OMPI_MCA_btl=self,vader,tcp", "OMPI_MCA_pml=ob1"});
  expect_suite_passed(p, n, "mpi");
}
INSTANTIATE_TEST_SUITE_P(Ranks, MpiCollectives, testing::Values(2, 3, 4));
#endif
