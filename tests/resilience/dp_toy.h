// The DeadPool tests' replica (dp_toy.cpp): data parallelism over a fixed number of SLOTS, each
// with state of its own (an RNG stream that adds its noise to the slot's gradient, as dropout
// would) besides the replicated weights and momentum. Gradients are summed as 2^-30 fixed point in
// int64, so the sum is exact in any order: a run is bitwise equal to the one-process reference
// whatever quorums it went through, as long as every slot's share of every step was counted once.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atl::resilience::test {

// Bitwise hash of (w, v, slot s's RNG) after `steps` steps of an uninterrupted job of `slots`.
std::vector<std::string> dp_reference(int slots, int64_t steps);

// --dp-replica ID SLOTS STEPS LIGHTHOUSE_PORT STEP_SLEEP_MS EVERY SPARE
//   SPARE = 1: wait in the pool, then become the slot it is given and restore it from the peer.
// Prints "commit STEP WALL_MS" per committed step, "restored slot S from the peer snapshot of step
// K at WALL_MS", "final STEP HASH WEIGHTS_HASH" at the end.
int dp_replica_main(int argc, char** argv);

// --dp-bench STATE_MB STEPS COMPUTE_PASSES: step time with peer snapshots off and on (bench/).
int dp_bench_main(int argc, char** argv);

}  // namespace atl::resilience::test
