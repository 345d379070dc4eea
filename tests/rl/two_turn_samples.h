// The RL tests' two-sample multi-turn fixture (test_multi_turn_ppo, test_disaggregated): row 0 is
// "3+4=" then "8" <end> "<=7" (the task's reply "<=", then "7") <end>, a two-turn episode whose
// reply tokens carry env = 1; row 1 is "2+2=" then "4" <end>, one turn. Rewards and groups are
// the caller's.
#pragma once
#include <vector>

#include "rl/rollout.h"
#include "rl/verifiable_task.h"

namespace atl::rl::rltest {

inline std::vector<Sample> two_turn_samples() {
  std::vector<Sample> s(2);
  s[0].prompt = encode("3+4=");
  s[0].completion = encode("8");
  s[0].completion.push_back(kEndMarker);
  for (int32_t id : encode("<=7")) s[0].completion.push_back(id);
  s[0].env = {0, 0, 1, 1, 0};
  s[0].stopped = true;
  s[0].turns = 2;
  s[1].prompt = encode("2+2=");
  s[1].completion = encode("4");
  s[1].stopped = true;
  return s;
}

}  // namespace atl::rl::rltest
