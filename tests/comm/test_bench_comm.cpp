// `atoll bench comm` end to end on tiny messages: both backends' jobs start, every operation and
// size has a row with both backends' figures, and the memcpy ceiling is printed.
#include <gtest/gtest.h>

#include <sstream>
#include <vector>

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

// `--gap-us` (what `atoll plan calibrate` reads for the wait that compute between collectives
// adds): every level prints --samples GAP lines, in the order given, each with the compute's CPU
// seconds before the all-reduce (about the level asked: GEMMs counted to fill it) and the
// collective's wall − CPU seconds. Outside a job it is refused with the command to run.
TEST(BenchComm, GapLevelsPrintTheComputeBeforeEachAllReduceAndItsWait) {
  Proc p = run({atoll_exe(), "bench", "comm", "--in-job", "--min-bytes", "4096", "--max-bytes", "4096", "--samples",
                "5", "--gap-us", "0", "2000"},
               60);
  ASSERT_FALSE(p.timed_out) << p.out;
  ASSERT_EQ(p.exit_code(), 0) << p.out;
  std::istringstream in(p.out);
  std::string line;
  std::vector<double> comp;
  while (std::getline(in, line)) {
    if (line.rfind("GAP ", 0) != 0) continue;
    std::istringstream f(line.substr(4));
    std::string backend, op;
    int n = 0;
    long long bytes = 0;
    double c = -1, w = -1;
    f >> backend >> op >> n >> bytes >> c >> w;
    ASSERT_FALSE(f.fail()) << line;
    EXPECT_EQ(op, "all_reduce") << line;
    EXPECT_EQ(bytes, 4096) << line;
    comp.push_back(c);
  }
  ASSERT_EQ(comp.size(), 10u) << p.out;
  // Level 0: no compute; level 2000 µs: GEMMs counted from one GEMM's CPU time, so the CPU time
  // is near 2 ms on any load (bounds 4× either way for a clock that counts per tick).
  for (int i = 0; i < 5; ++i) EXPECT_LT(comp[size_t(i)], 1e-4) << p.out;
  for (int i = 5; i < 10; ++i) {
    EXPECT_GT(comp[size_t(i)], 0.5e-3) << p.out;
    EXPECT_LT(comp[size_t(i)], 8e-3) << p.out;
  }
  Proc bad = run({atoll_exe(), "bench", "comm", "--gap-us", "100"}, 60);
  EXPECT_NE(bad.exit_code(), 0);
  EXPECT_NE(bad.out.find("--in-job"), std::string::npos) << bad.out;
}
