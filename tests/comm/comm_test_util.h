// Helpers shared by the communication tests: the collective checks every backend must pass,
// and running commands (the launcher, mpirun) with a deadline.
#pragma once
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace atl::comm::test {

// Runs every collective for several dtypes and odd sizes against a serial reference computed
// from the same deterministic inputs; throws atl::Error describing the first mismatch.
// Returns the number of checks made.
int check_all_collectives(Communicator& c);

struct Proc {
  int status = -1;     // raw waitpid status
  bool timed_out = false;
  double seconds = 0;
  std::string out;     // stdout and stderr interleaved
  int exit_code() const;
};
// Runs argv with extra "K=V" environment entries; kills its process group after timeout_s.
Proc run(const std::vector<std::string>& argv, double timeout_s, const std::vector<std::string>& env = {});

std::string self_exe();
std::string atoll_exe();
int count_of(const std::string& hay, const std::string& needle);

// `test_comm --worker MODE ARGS...`: the rank side of the multi-process tests.
int run_worker(int argc, char** argv);

}  // namespace atl::comm::test
