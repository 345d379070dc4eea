// Rank programs of the multi-process gate tests (`test_resilience --rank-program NAME`), started
// with torchrun's environment by run_ranks().
#pragma once
#include <string>
#include <vector>

namespace atl::resilience::test {

int rank_program_main(const std::string& name);
int signatures_rank_program();  // test_signatures.cpp
int replay_rank_program();      // test_replay.cpp
int campaign_rank_program();    // campaign_toy.cpp
int watch_rank_program();       // test_watch.cpp
int pgc_rank_program();         // test_pipelined_gc.cpp
// `test_resilience --progress-bench`: the cost of one progress-record update (test_watch.cpp).
int progress_bench_main();
// Runs `world` rank programs `name` with a fresh port (and `env`); returns each exit status, logs in tag.log<r>.
std::vector<int> run_ranks(int world, const std::string& name, const std::string& tag, double timeout_s,
                           const std::vector<std::string>& env = {});

}  // namespace atl::resilience::test
