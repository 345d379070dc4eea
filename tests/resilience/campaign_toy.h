// The fault-injection campaign on the toy model (resilience/fault_campaign.h; issue 14 item 4).
//
// The job: `world` Gloo ranks train the toy regression (ft_toy.h) data-parallel, each through a
// FaultHookCommunicator, each heartbeating to an in-process lighthouse (the out-of-band observer),
// each checkpointing into its own directory. Every step, in order: a phase-guard all-gather, a
// scrub of the rank's newest checkpoint against its manifest, the rank's share of the gradient,
// the gradient exchange as checksummed point-to-point messages, the receivers' accusations voted
// on, SCOUT's cross-replay of every share, SCOUT's signatures, the update, a checkpoint every
// `checkpoint_every` steps, and a vote on the checkpoint's health. Faults fire at step boundaries
// on the ranks the campaign names; a recoverable fault is repaired in place (the state broadcast
// from the majority, or, with no majority, every rank rolled back to its last checkpoint; the
// loaders realigned; the checkpoint written again; the exchange sent again), a fatal one ends the
// job's processes and the driver restarts all of them from the newest checkpoint every rank holds,
// going on with the next fault: one campaign is one job with restarts.
//
// The driver (run_campaign) turns what it sees into detections too: a rank that exited or was
// killed (its wait status), a rank whose heartbeats stopped (the lighthouse), and, when ranks fail
// in a collective, who timed out waiting for whom.
#pragma once
#include <string>
#include <vector>

#include "resilience/fault_campaign.h"

namespace atl::resilience::test {

inline std::string ranks_str(const std::vector<int>& r) {
  std::string s;
  for (int x : r) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s.empty() ? "-" : s;
}
// Evidence about these ranks alone (no vote): named at any world size.
inline Localization evidence(const std::vector<int>& bad) {
  Localization l;
  if (!bad.empty()) {
    l.verdict = Localization::outlier;
    l.ranks = bad;
  }
  return l;
}

struct CampaignRun {
  Campaign campaign;
  std::vector<Detection> detections;
  CampaignScore score;
  int segments = 0;  // 1 + restarts
  double seconds = 0;
  bool completed = false;  // the job reached its last step
  std::string problem;     // why not
};

// Runs the campaign file's schedule at `world` ranks in `workdir` (created, left in place).
CampaignRun run_campaign(const std::string& campaign_path, int world, const std::string& workdir,
                         double timeout_s = 240);

// `test_resilience --rank-program campaign` (env ATOLL_CAMPAIGN, ATOLL_CAMPAIGN_DIR,
// ATOLL_CAMPAIGN_FIRST, ATOLL_CAMPAIGN_START, ATOLL_CAMPAIGN_LIGHTHOUSE).
int campaign_rank_program();

// `test_resilience --campaign FILE WORLD [WORKDIR]`: runs it and prints the score table.
int campaign_main(int argc, char** argv);

}  // namespace atl::resilience::test
