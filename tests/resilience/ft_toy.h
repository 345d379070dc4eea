// The fault-tolerance tests' replica: linear regression trained with momentum SGD plus a small
// RNG-driven perturbation per step (so a replica that healed its weights but not its RNG would
// drift). All of it is deterministic in the step: global batch kG rows per step, split over the
// quorum's members, gradient summed over the quorum, so the result does not depend on how many
// replicas took part (up to float summation order).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atl::resilience::test {

constexpr int kDim = 32, kG = 12;

struct ToyModel {
  std::vector<float> w, v;
  uint64_t rng = 12345;
  ToyModel();
  // The gradient (summed over rows, divided by kG) of rows [r0, r1) of step `step`'s batch.
  std::vector<float> grad(int64_t step, int r0, int r1) const;
  void apply(const std::vector<float>& g);
  uint64_t hash() const;  // of w, v and rng: bitwise identity
};

// One process: `steps` steps of the same math (the reference).
ToyModel train_single(int64_t steps);

// --ft-replica ID STEPS LIGHTHOUSE_PORT STEP_SLEEP_MS OUT
// Prints "commit STEP WALL_MS" per committed step and "final STEP HASH" at the end; writes w to OUT.
int replica_main(int argc, char** argv);

}  // namespace atl::resilience::test
