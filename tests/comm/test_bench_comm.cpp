// `atoll bench comm` end to end on tiny messages: both backends' jobs start, every operation and
// size has a row with both backends' figures, and the memcpy ceiling is printed.
#include <gtest/gtest.h>

#include <sstream>

#include "comm_test_util.h"

using namespace atl::comm::test;

TEST(BenchComm, SideBySideTableForGlooAndMpi) {
  Proc p = run({atoll_exe(), "bench", "comm", "--nproc", "2", "--min-bytes", "64", "--max-bytes", "1024",
                "--seconds", "0.01"},
               60);
  ASSERT_FALSE(p.timed_out) << p.out;
  ASSERT_EQ(p.exit_code(), 0) << p.out;
  for (const char* op : {"all_reduce, 2 ranks", "reduce_scatter, 2 ranks", "all_gather, 2 ranks"})
    EXPECT_EQ(count_of(p.out, op), 1) << p.out;
  EXPECT_EQ(count_of(p.out, "gloo:us"), 3) << p.out;
#ifdef ATOLL_HAVE_MPI
  EXPECT_EQ(count_of(p.out, "mpi:us"), 3) << p.out;
#endif
  // Rows for 64, 256 and 1024 bytes, each with a positive time for every backend.
  std::istringstream in(p.out);
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    long long size;
    if (!(f >> size) || (size != 64 && size != 256 && size != 1024)) continue;
    ++rows;
    EXPECT_EQ(line.find(" - "), std::string::npos) << "missing figure: " << line;
    std::string bar;
    double us, alg, bus;
    while (f >> bar >> us >> alg >> bus) EXPECT_GT(us, 0) << line;
  }
  EXPECT_EQ(rows, 9) << p.out;
  EXPECT_NE(p.out.find("host memcpy bandwidth"), std::string::npos) << p.out;
}

// `--samples N` (what `atoll plan calibrate` reads): at least N iterations per size, each timed
// alone and printed as a SAMPLE line beside the size's RESULT mean, so the caller can take medians.
// With --seconds 0 the count is exactly N (the time budget asks for the minimum of 3). Each
// iteration also prints a CPUTIME line: its CPU seconds in the rank's process.
TEST(BenchComm, SamplesPrintEveryIterationOfEverySize) {
  Proc p = run({atoll_exe(), "bench", "comm", "--in-job", "--min-bytes", "64", "--max-bytes", "256", "--seconds", "0",
                "--samples", "7"},
               60);
  ASSERT_FALSE(p.timed_out) << p.out;
  ASSERT_EQ(p.exit_code(), 0) << p.out;
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"})
    for (const char* size : {" 64 ", " 256 "}) {
      std::istringstream in(p.out);
      std::string line;
      int samples = 0, results = 0, cpu = 0;
      while (std::getline(in, line)) {
        if (line.find(op) == std::string::npos || line.find(size) == std::string::npos) continue;
        samples += line.rfind("SAMPLE ", 0) == 0;
        results += line.rfind("RESULT ", 0) == 0;
        if (line.rfind("CPUTIME ", 0) == 0) {
          ++cpu;
          // A CPU time that is a number, not negative (issue 16: the calibration's CPU-time fit).
          double secs = std::stod(line.substr(line.rfind(' ') + 1));
          EXPECT_GE(secs, 0.0) << line;
        }
      }
      EXPECT_EQ(samples, 7) << op << size << "\n" << p.out;
      // The same iterations in the rank's process CPU seconds, one line each.
      EXPECT_EQ(cpu, 7) << op << size << "\n" << p.out;
      EXPECT_EQ(results, 1) << op << size << "\n" << p.out;
    }
}
