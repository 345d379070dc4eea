// Per-step signatures and strict-majority consensus among equivalent replicas (after SCOUT's
// consensus fault localization; issue 14 item 3). Every data-parallel rank computes, after the
// gradient all-reduce, values that must be bitwise equal on all of them (the averaged gradient's
// hash and norm, the job's loss, the collective fingerprint) plus its own compute time; the
// signatures are exchanged (one 56-byte all-gather) and compared:
//
//  - an exact field names the ranks outside the group that holds a strict majority (> n/2); with
//    no strict majority (2 ranks that differ, or a 2-2 split) the verdict is "inconclusive" and no
//    rank is named, so a wrong rank is never blamed;
//  - compute time names a rank slower than factor x the median of the others and by more than
//    min_delta_ms, again only when the ranks that agree with each other are a strict majority.
//
// What it can see: corruption that makes one replica's copy differ from the others' (a bit flip in
// its averaged gradient or its update, a desynchronized collective, a straggler). What it cannot:
// corruption that enters before the all-reduce (every rank then averages the same bad gradient);
// that needs SCOUT's in-situ replay (scout_replay.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace atl::resilience {

struct StepSignature {
  int64_t step = 0;
  double compute_ms = 0;  // from the step's start to its gradient all-reduce
  double loss = 0;        // the job's (averaged) loss
  double grad_norm = 0;   // of the averaged gradient
  uint64_t grad_hash = 0;  // of the averaged gradient, bitwise
  uint64_t param_hash = 0;  // of the parameters the step started from (a corrupted replica stays named)
  uint64_t fingerprint = 0;  // of the collectives issued so far (op names, sizes, count)
};

// A fast bitwise hash of a buffer (8 bytes at a time; not cryptographic).
uint64_t buffer_hash(const void* data, size_t n);

struct Consensus {
  enum Verdict { clean, outlier, inconclusive } verdict = clean;
  std::vector<int> ranks;  // the outliers (verdict outlier)
  std::string field;       // the first field that differed
  std::string message;     // one sentence for the log
};

struct ConsensusOptions {
  double time_factor = 3.0;
  double min_delta_ms = 250;
};

Consensus find_outliers(const std::vector<StepSignature>& sigs, const ConsensusOptions& o = {});

// Collective: every rank's signature (index = rank).
std::vector<StepSignature> exchange_signatures(comm::Communicator& comm, const StepSignature& mine);

}  // namespace atl::resilience
