// The fault-injection campaign inside `atoll train` (issue 14 item 4, docs/fault_tolerance.md):
// [fault] campaign = "file.json" (the campaign file of resilience/fault_campaign.h) fires its
// faults at step boundaries of a real data-parallel run, detects them with detectors the trainer
// can run, repairs what can be repaired in place, and records per fault what was detected, by
// which detector, where, and how the run recovered, in metrics.jsonl and RUN_DIR/campaign/.
//
// Types fired in the trainer (the others of the 21 are refused naming these): tensor_corruption,
// stale_state, config_drift, delay, hang, timeout, exception, process_termination,
// checkpoint_corruption, checkpoint_truncation, checkpoint_missing, checkpoint_io_error,
// payload_corruption, collective_desync, drop, duplicate, reorder, resource_exhaustion,
// message_drop — every family. Detectors:
//  - state self-check (evidence): each rank hashes its parameters after its update and again at
//    the next boundary; a rank whose parameters changed outside the optimizer (a flipped bit, the
//    state of 3 steps earlier put back) names itself. Repair: the weights and optimizer state
//    broadcast from the lowest healthy rank, before the step runs, so the trajectory stays the
//    clean run's.
//  - data position self-check (evidence): each rank keeps its loader's state after its update; a
//    rank whose loader moved between steps (a batch skipped, served again, or the next two
//    swapped: the first served is one ahead) names itself. Repair: the loader put back, before the
//    step reads from it.
//  - config hash (vote): each rank's hash of the hyperparameters it will use for the step; the
//    ranks outside a strict majority are named. Repair: every rank back to the configuration the
//    pre-run gate agreed on, before the step runs.
//  - boundary timing (vote): the rank's own time at the boundary before the step's first collective;
//    a rank 1 s above the others' median is named when the others are a strict majority.
//  - phase fingerprints (vote): resilience::gather_phases, then localize_by_majority.
//  - gradient checksum (evidence): every gradient bucket checked against its senders' checksums
//    (resilience/gradient_checksum_comm.h); a mismatch re-sends the contributions with their
//    CRCs and names the sender whose payload fails (a message_drop: whose payload never arrived,
//    its slot left empty). Repair: the bucket reduced again.
//  - checkpoint scrub (evidence, the writer, rank 0): the newest checkpoint written against its
//    manifest. Repair: a checkpoint written again at this step.
//  - checkpoint write (evidence, rank 0): the save's own error. Repair: written again.
//  - exit status (evidence): a fatal fault ends the job; `atoll launch` writes every rank's exit
//    status to $ATOLL_FAILURE_FILE; the run resumed (`--resume`, or the launcher's own restart,
//    `--max-restarts`) names the ranks that ended on their own (not torn down by the launcher)
//    and whose progress record shows no failed collective (a peer of a dead rank fails in a
//    collective). Repair: the resume.
//  - who waits on whom (evidence): when ranks failed in a collective (their timeout) and a rank torn
//    down had, by its own progress record, not entered that collective, that rank is named.
//  - watcher (evidence): `atoll launch --watch` names a stopped (SIGSTOP) or stuck rank and adds it to
//    $ATOLL_FAILURE_FILE; the resumed run records it.
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
#include "resilience/gradient_checksum_comm.h"
#include "resilience/fault_campaign.h"
#include "train/task.h"
#include "train/trainer.h"

namespace atl {

class CampaignHook {
 public:
  // Before the run's progress record is opened (it reads this rank's record of a previous run).
  // grad_check: the data-parallel communicator's payload check (null: payload_corruption refused).
  CampaignHook(const TrainOptions& o, comm::Communicator* comm, const std::string& strategy, bool plain_dp,
               resilience::GradientChecksumComm* grad_check);
  // At the top of step `step` (1-based, the step about to run): fires this rank's faults scheduled
  // there, runs the detectors (collective) and the repairs.
  void at_boundary(int64_t step, int64_t start, nn::Model& model, parallel::DataParallel& dp, Task& task,
                   const TaskEnv& env);
  void after_update(const nn::Model& model, const Task& task);  // the parameter hash the next boundary checks; payload findings
  float lr_factor() const { return lr_factor_; }  // 1 unless a config_drift is in force
  void before_checkpoint(int64_t step);  // rank 0: arms a checkpoint_io_error due at this step
  // The checkpoint save threw: true when that was the armed fault (recorded; save again).
  bool checkpoint_failed(int64_t step, const std::string& why);
  bool checkpoint_now() const { return want_checkpoint_; }
  void checkpoint_written(int64_t step, const std::string& dir);
  // This step's detections for its metrics record (null when none).
  nlohmann::json step_record();
  // At the run's last step (rank 0): the scored campaign, for metrics.jsonl and campaign/score.json.
  nlohmann::json summary();

 private:
  void record(int64_t step, const std::string& detector, const resilience::Localization& where,
              const std::string& detail, const std::string& recovery);
  void fire(const resilience::ScheduledFault& f, nn::Model& model, parallel::DataParallel& dp, Task& task,
            const TaskEnv& env);
  void repair_state(int root, nn::Model& model, parallel::DataParallel& dp);

  uint64_t config_hash() const;

  resilience::Campaign c_;
  comm::Communicator* comm_;
  resilience::GradientChecksumComm* grad_check_;
  float lr_factor_ = 1.f;  // the learning rate's drift (config_drift)
  double grad_clip_ = 0;
  int64_t steps_ = 0, ckpt_every_ = 0, step_ = 0;
  std::string stale_[2];  // stale_state: the weights and optimizer state of an earlier boundary
  int64_t stale_from_ = -1;
  nlohmann::json data_after_;  // the loader's state after this rank's last update
  int64_t batch_rows_ = 0;     // rows one next_batch() takes (from the last step's advance)
  int64_t grad_accum_ = 1;
  int64_t cpu_ns_ = 0, boundaries_ = 0, proc_cpu0_ns_ = 0;  // the boundary checks' CPU time (summary)
  bool fsize_armed_ = false;  // checkpoint_io_error: RLIMIT_FSIZE lowered for the save
  uint64_t fsize_soft_ = 0;
  int rank_ = 0, world_ = 1;
  std::string dir_, run_dir_, ckpt_dir_, last_ckpt_;
  std::vector<int> fired_;  // fault indices already fired (this run or one before it)
  uint64_t param_hash_ = 0;
  bool have_hash_ = false, want_checkpoint_ = false, first_ = true, desync_ = false;
  int64_t old_step_ = -1, old_failed_ = 0, old_started_ = 0;  // this rank's progress record of the previous run
  nlohmann::json step_dets_ = nlohmann::json::array();
  std::chrono::steady_clock::time_point entered_;
};

}  // namespace atl
