// SCOUT's in-situ replay and clean-replay certificates (issue 14 item 3; after SCOUT's replay-based
// confirmation of consensus suspects). The signatures (step_signature.h) compare what every
// replica must hold after the all-reduce, so they cannot see corruption that enters before it: a
// bit flipped in one rank's own gradient share is averaged into everyone's gradient alike. A
// replay can: each rank's share of the step is recomputed, from the state the step started from,
// by other ranks beside the live job, and the computations of each share vote.
//
//   cross_replay: rank r computed its own share (hash of its local gradient before the all-reduce,
//   and the time it took); it also replays the shares of the `witnesses` ranks before it (r-1,
//   r-2, mod n). Every share then has 1 + witnesses computations on different ranks:
//    - SDC: a computation outside the strict majority of its share's computations names the rank
//      that made it (its own share or its replay of another's); without a strict majority (n = 2)
//      the share is inconclusive and no rank is named;
//    - straggler: a rank whose own share took `time_factor` x longer (and `min_delta_ms` more) than
//      the fastest replay of that share elsewhere is slow itself (the node, not the work);
//    - slow share: a share slow wherever it was computed is the data's doing, not a node's, and is
//      named as such (no rank is blamed).
//   One all-gather of 3 + 3 x witnesses int64 per rank; the replays cost `witnesses` share
//   computations per rank, so a job audits only suspect steps or every k-th step.
//
//   Certificates: a checkpoint is clean when every step since the last clean checkpoint was audited
//   and none was found corrupt (a corrupted step taints every later state, so cleanliness is a
//   chain). The trainer stores the certificate in the checkpoint's state.json (covered by its
//   manifest checksum) under "replay_certificate"; choose_certified_checkpoint() resumes from the
//   newest complete, verified and clean checkpoint, never from one after an SDC.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "resilience/checkpoint_select.h"

namespace atl::resilience {

struct ShareRun {
  uint64_t hash = 0;  // of the share's result (the local gradient before the all-reduce), bitwise
  double ms = 0;
};

struct ReplayOptions {
  int witnesses = 2;  // replays per share (capped at n - 1)
  double time_factor = 3.0;
  double min_delta_ms = 250;
};

struct ReplayFinding {
  std::vector<int> sdc;           // ranks whose computations their share's majority outvoted
  std::vector<int> corrupt_shares;  // shares whose owner's own computation was outvoted: the step's
                                    // reduced gradient holds a bad share (a bad replay alone does not)
  std::vector<int> stragglers;    // ranks slow at their own share, fast elsewhere
  std::vector<int> slow_shares;   // shares slow wherever computed (the data)
  std::vector<int> inconclusive;  // shares whose computations differ without a strict majority
  std::string message;            // one sentence for the log
  bool clean() const { return sdc.empty() && stragglers.empty() && inconclusive.empty(); }
};

// Collective over the step's ranks (every rank calls it for the same step). `replay(share)`
// recomputes share `share` of the step from the state it started from.
ReplayFinding cross_replay(comm::Communicator& comm, const ShareRun& own, const std::function<ShareRun(int)>& replay,
                           const ReplayOptions& o = {});
// The decision alone, on every rank's [own hash, own ms, (share, hash, ms) x witnesses] (for tests
// and for a job that gathers them otherwise).
ReplayFinding judge_replays(const std::vector<std::vector<int64_t>>& rows, int witnesses, const ReplayOptions& o = {});

// Steps (prev, step] audited `audited` times with `corrupt` SDC findings; clean = the previous
// certificate was clean, every step was audited and none was corrupt.
struct ReplayCertificate {
  int64_t step = 0, since = 0, audited = 0, corrupt = 0;
  bool clean = false;
  std::string finding;  // the first SDC finding, if any
  nlohmann::json to_json() const;
  static ReplayCertificate from_json(const nlohmann::json& j);
};

// Accumulates audits between checkpoints. A step is corrupt when a share that went into its update
// was outvoted (corrupt_shares) or could not be judged (inconclusive); a witness's bad replay names
// that witness but leaves the state clean.
class CertificateChain {
 public:
  // Continue a chain from a checkpoint at `step` (resumed): clean if its certificate was.
  void resume(int64_t step, bool clean);
  void audited(int64_t step, const ReplayFinding& f);
  // The certificate for a checkpoint at `step`; starts the next interval.
  ReplayCertificate certify(int64_t step);

 private:
  bool prev_clean_ = true;
  int64_t since_ = 0, audited_ = 0, corrupt_ = 0;
  std::string finding_;
};

// Like choose_resume_checkpoint, but a checkpoint must also carry a clean "replay_certificate" in
// its state.json; the others are rejected with why (none, or the SDC that tainted it).
ResumeChoice choose_certified_checkpoint(const std::string& dir);

}  // namespace atl::resilience
