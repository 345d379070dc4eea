// The fault-injection campaign (issue 14 item 4): the 21 fault types of the lm-resiliency catalog
// in its 5 families, a seeded JSON campaign file that schedules them at step boundaries on chosen
// ranks, the votes that turn per-rank evidence into a localization, and the exact scorer.
//
// Localization comes in two kinds, and the scorer holds each to its own rule:
//  - by vote: equivalent replicas compare what must be equal (SCOUT signatures, replay hashes,
//    phase fingerprints, message checksums, who timed out waiting for whom). A rank is named only
//    when the ranks that agree are a strict majority (> n/2); otherwise the verdict is
//    "inconclusive" and nobody is named. With 2 ranks a vote is always inconclusive.
//  - by evidence: something observed about one rank alone: its process exited or was killed (the
//    launcher's wait status), its heartbeats stopped while its connection stayed open (the
//    lighthouse observer), its own checkpoint failed its manifest or its write failed. No vote is
//    involved, so it names the rank at any world size.
// The score of a fault is "exact" when its detections name exactly the injected rank set (an extra
// rank is an error), "inconclusive", "wrong" (a detection in its window names another set), or
// "missed". A detection outside every fault's window is a false positive.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atl::resilience {

struct FaultType {
  const char* name;     // as in the campaign file: "tensor_corruption"
  const char* family;   // numeric/state, performance/liveness, runtime, checkpoint/storage, communication
  const char* what;     // what the injector really does
  const char* detector; // what names the rank
  bool by_vote;         // localized by a vote (inconclusive without a strict majority) or by evidence
  bool fatal;           // ends the job's processes: the campaign restarts them from the last checkpoint
};

// The 21 types, in catalog order.
const std::vector<FaultType>& fault_catalog();
const FaultType& fault_type(const std::string& name);  // throws naming the unknown type and the known ones

struct ScheduledFault {
  int index = 0;  // in step order
  std::string type;
  int64_t step = 0;        // fired at the boundary before this step
  std::vector<int> ranks;  // sorted
};

struct Campaign {
  uint64_t seed = 0;
  int world = 4;
  int64_t steps = 0;           // the job's length
  int64_t checkpoint_every = 10;
  std::vector<ScheduledFault> faults;  // sorted by step, distinct steps
};

// The campaign file:
//   {"seed": 14, "first_step": 6, "spacing": 5, "checkpoint_every": 10, "tail": 6,
//    "faults": ["tensor_corruption", {"type": "hang", "rank": 1}, {"type": "delay", "step": 40}, ...]}
// Each fault is a type name or an object with "type" and optionally "rank" (or "ranks") and
// "step". Missing ranks are drawn from the seed (uniform over the world); missing steps follow
// the previous fault's by `spacing` plus a seeded jitter of 0..2. steps = the last fault's + tail,
// or "steps" (required for a clean run, "faults": []).
// Unknown keys and types, bad ranks and repeated or decreasing steps are refused, naming the fault
// and the key. `world` comes from the caller, so one file runs at 4 ranks and at 2.
Campaign parse_campaign(const std::string& json_text, int world, const std::string& where);

struct Localization {
  enum Verdict { clean, outlier, inconclusive } verdict = clean;
  std::vector<int> ranks;  // sorted; outlier only
};
const char* verdict_name(Localization::Verdict v);

// Strict majority over one value per rank: the ranks outside the majority group are named; no group
// with more than n/2 ranks: inconclusive; all equal: clean.
Localization localize_by_majority(const std::vector<std::string>& value_per_rank);
// accused[r] = the ranks rank r blames (its message from them failed its checksum, or never came).
// A rank is named when more than n/2 other ranks blame it (n = 4: 3 accusers; n = 2: one accuser is
// never enough, since the accuser's own link is as suspect as the accused's). Accusations that name
// nobody past that bar make the verdict inconclusive.
Localization localize_by_accusations(const std::vector<std::vector<int>>& accused);

struct Detection {
  int64_t step = 0;
  std::string detector;
  Localization where;
  std::string detail;
};

struct FaultScore {
  ScheduledFault fault;
  std::string outcome;  // exact, inconclusive, wrong, missed
  std::vector<Detection> detections;  // the ones attributed to it
};

struct CampaignScore {
  std::vector<FaultScore> faults;
  std::vector<Detection> false_positives;
  int exact = 0, inconclusive = 0, wrong = 0, missed = 0;
};

// A detection at step d belongs to the latest fault with step <= d <= step + window.
CampaignScore score_campaign(const Campaign& c, const std::vector<Detection>& detections, int64_t window = 2);
// The score table (one row per fault, then the totals and the false positives).
std::string format_score(const Campaign& c, const CampaignScore& s);

}  // namespace atl::resilience
