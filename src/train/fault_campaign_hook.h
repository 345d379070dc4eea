// The fault-injection campaign inside `atoll train` (issue 14 item 4, docs/fault_tolerance.md):
// [fault] campaign = "file.json" (the campaign file of resilience/fault_campaign.h) fires its
// faults at step boundaries of a real data-parallel run, detects them with detectors the trainer
// can run, repairs what can be repaired in place, and records per fault what was detected, by
// which detector, where, and how the run recovered, in metrics.jsonl and RUN_DIR/campaign/.
//
// Types fired in the trainer (the others of the 21 are refused naming these): tensor_corruption,
// delay, exception, process_termination, checkpoint_corruption, checkpoint_truncation,
// checkpoint_missing, collective_desync — every family. Detectors:
//  - state self-check (evidence): each rank hashes its parameters after its update and again at
//    the next boundary; a rank whose parameters changed outside the optimizer names itself. Repair:
//    the weights and optimizer state broadcast from the lowest healthy rank, before the step runs,
//    so the trajectory stays the clean run's.
//  - boundary timing (vote): the rank's own time at the boundary before the step's first collective;
//    a rank 1 s above the others' median is named when the others are a strict majority.
//  - phase fingerprints (vote): resilience::gather_phases, then localize_by_majority.
//  - checkpoint scrub (evidence, the writer, rank 0): the newest checkpoint written against its
//    manifest. Repair: a checkpoint written again at this step.
//  - exit status (evidence): a fatal fault ends the job; `atoll launch` writes every rank's exit
//    status to $ATOLL_FAILURE_FILE; the run resumed (`--resume`) names the ranks that ended on their
//    own (not torn down by the launcher) and whose progress record shows no failed collective (a
//    peer of a dead rank fails in a collective). Repair: the resume.
// Faults fired are kept in RUN_DIR/campaign/fired.jsonl, so a resumed run does not fire them again.
#pragma once
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "nn/model.h"
#include "parallel/data_parallel.h"
#include "resilience/fault_campaign.h"
#include "train/trainer.h"

namespace atl {

class CampaignHook {
 public:
  // Before the run's progress record is opened (it reads this rank's record of a previous run).
  CampaignHook(const TrainOptions& o, comm::Communicator* comm, const std::string& strategy, bool plain_dp);
  // At the top of step `step` (1-based, the step about to run): fires this rank's faults scheduled
  // there, runs the detectors (collective) and the repairs.
  void at_boundary(int64_t step, int64_t start, nn::Model& model, parallel::DataParallel& dp);
  void after_update(const nn::Model& model);  // the parameter hash the next boundary checks
  bool checkpoint_now() const { return want_checkpoint_; }
  void checkpoint_written(int64_t step, const std::string& dir);
  // This step's detections for its metrics record (null when none).
  nlohmann::json step_record();
  // At the run's last step (rank 0): the scored campaign, for metrics.jsonl and campaign/score.json.
  nlohmann::json summary();

 private:
  void record(int64_t step, const std::string& detector, const resilience::Localization& where,
              const std::string& detail, const std::string& recovery);
  void fire(const resilience::ScheduledFault& f, nn::Model& model);
  void repair_state(int root, nn::Model& model, parallel::DataParallel& dp);

  resilience::Campaign c_;
  comm::Communicator* comm_;
  int rank_ = 0, world_ = 1;
  std::string dir_, run_dir_, ckpt_dir_, last_ckpt_;
  std::vector<int> fired_;  // fault indices already fired (this run or one before it)
  uint64_t param_hash_ = 0;
  bool have_hash_ = false, want_checkpoint_ = false, first_ = true, desync_ = false;
  int64_t old_step_ = -1, old_failed_ = 0;  // this rank's progress record of the previous run
  nlohmann::json step_dets_ = nlohmann::json::array();
  std::chrono::steady_clock::time_point entered_;
};

}  // namespace atl
