// The pre-run invariant gate (issue 14, item 6; after the B300 field report's uneven-packing
// deadlock): before step 1 every rank declares what must be identical, or disjoint, across the
// job, and a launch that breaks any of it is refused in seconds with one message naming each
// difference and the ranks on each side, instead of hanging (or silently diverging) later.
//
//   identical: config hash, parameter hash and count, dtype, world layout (world size, ranks per
//              node, mesh, strategy), the data's index space, and this epoch's per-rank batch count
//              (unequal counts leave some ranks in a collective the others never reach);
//   disjoint:  the data shards ([begin, end) ranges in that index space) of different ranks.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace atl::resilience {

struct RunFacts {
  std::string config_hash;  // hex of the job's config (rank-independent text)
  std::string param_hash;   // hex of the initial (or resumed) parameters, bitwise
  int64_t param_count = 0;
  std::string dtype;
  std::string layout;  // "world=4 local=2 mesh=... strategy=ddp"
  std::string data_space;  // what the shard ranges index ("train windows mod 4 of files <hash>")
  std::vector<std::pair<int64_t, int64_t>> shards;  // [begin, end) this rank reads this epoch
  int64_t batches_per_epoch = 0;
};

// 64-bit FNV-1a of bytes, as 16 hex digits.
std::string hash_hex(const void* data, size_t n);
inline std::string hash_hex(const std::string& s) { return hash_hex(s.data(), s.size()); }

// The problems, one sentence each, of the facts of every rank (index = rank); empty: all agree.
std::vector<std::string> compare_run_facts(const std::vector<RunFacts>& all);

// Collective: gathers every rank's facts and throws atl::Error ("pre-run gate: ...") on every rank
// when compare_run_facts finds anything, within `timeout` (a rank that never arrives is named by
// the communicator's own timeout error).
void check_run_invariants(comm::Communicator& comm, const RunFacts& mine,
                          std::chrono::milliseconds timeout = std::chrono::milliseconds(30000));

}  // namespace atl::resilience
