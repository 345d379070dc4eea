// test_parallel's entry point: GoogleTest, or one rank of a multi-process test when started with
// --worker (see harness.cpp).
#include <gtest/gtest.h>

#include <cstring>

#include "harness.h"

int main(int argc, char** argv) {
  if (argc >= 2 && !std::strcmp(argv[1], "--worker")) return atl::parallel::test::worker_main(argc - 2, argv + 2);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
