// test_resilience's entry point: GoogleTest, or one replica of a fault-tolerance test when started
// with --ft-replica (ft_toy.cpp).
#include <gtest/gtest.h>

#include <cstring>

#include "campaign_toy.h"
#include "dp_toy.h"
#include "ft_toy.h"
#include "rank_programs.h"

int main(int argc, char** argv) {
  if (argc >= 2 && !std::strcmp(argv[1], "--ft-replica")) return atl::resilience::test::replica_main(argc - 2, argv + 2);
  if (argc >= 2 && !std::strcmp(argv[1], "--dp-replica")) return atl::resilience::test::dp_replica_main(argc - 2, argv + 2);
  if (argc >= 2 && !std::strcmp(argv[1], "--dp-bench")) return atl::resilience::test::dp_bench_main(argc - 2, argv + 2);
  if (argc >= 2 && !std::strcmp(argv[1], "--campaign")) return atl::resilience::test::campaign_main(argc - 2, argv + 2);
  if (argc >= 2 && !std::strcmp(argv[1], "--progress-bench")) return atl::resilience::test::progress_bench_main();
  if (argc >= 3 && !std::strcmp(argv[1], "--rank-program")) return atl::resilience::test::rank_program_main(argv[2]);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
