// Collective fingerprints at phase boundaries (issue 14: the step-zero evaluation hazard). When
// only some ranks run an evaluation, a sample or a checkpoint, their next collective pairs with a
// different one on the other ranks: a hang, or worse, a reduction of unrelated tensors. With
// check() called by every rank at every boundary (each step's start, before an evaluation, a
// sample, a checkpoint), the two paths meet in this one small all-gather instead, and its
// fingerprint (phase name and step) tells them apart: every rank throws, naming which ranks are
// where. Cost: one all-gather of 16 bytes per boundary.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace atl::resilience {

void check_phase(comm::Communicator& comm, const std::string& phase, int64_t step);

// The same all-gather without the verdict: where every rank is, as "phase@step" (index = rank),
// for a caller that localizes the odd ones itself (the fault campaign votes on them).
std::vector<std::string> gather_phases(comm::Communicator& comm, const std::string& phase, int64_t step);

}  // namespace atl::resilience
