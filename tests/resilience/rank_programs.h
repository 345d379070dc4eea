// Rank programs of the multi-process gate tests (`test_resilience --rank-program NAME`), started
// with torchrun's environment by run_ranks().
#pragma once
#include <string>
#include <vector>

namespace atl::resilience::test {

int rank_program_main(const std::string& name);
// Runs `world` rank programs `name` with a fresh port; returns each exit status, logs in tag.log<r>.
std::vector<int> run_ranks(int world, const std::string& name, const std::string& tag, double timeout_s);

}  // namespace atl::resilience::test
