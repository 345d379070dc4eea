// test_comm's entry point: GoogleTest, or a rank of a multi-process test when started with
// --worker (see worker.cpp).
#include <gtest/gtest.h>

#include <cstring>

#include "comm_test_util.h"

int main(int argc, char** argv) {
  if (argc >= 2 && !std::strcmp(argv[1], "--worker")) return atl::comm::test::run_worker(argc - 2, argv + 2);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
