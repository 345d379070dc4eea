// The trainer's hooks into resilience/ (issue 14, docs/fault_tolerance.md), kept out of the loop:
// the [fault] keys, the pre-run gate's facts, and QuorumHook, which runs each step of a
// [fault] tolerance = "quorum" replica through resilience::QuorumReplica.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/config.h"
#include "nn/model.h"
#include "parallel/data_parallel.h"
#include "resilience/deadpool.h"
#include "resilience/phase_guard.h"
#include "resilience/progress_record.h"
#include "resilience/quorum.h"
#include "tensor/rng.h"
#include "train/task.h"
#include "train/trainer.h"

namespace atl {

void read_fault_options(Config& c, TrainOptions& o);
// Bitwise hash of the model's flat parameters.
std::string parameter_hash(const nn::Model& model);
// Collective: refuses the launch (atl::Error naming each difference and its ranks) unless every
// rank agrees on config, parameters, dtype, layout and data (resilience/invariant_gate.h).
void run_pre_run_gate(comm::Communicator& comm, const TrainOptions& o, const std::string& config_text,
                      const std::string& param_hash, const nn::Model& model, const Task& task,
                      const std::string& layout, int world);

// [fault] signatures = true (DDP only): SCOUT-style per-step signatures exchanged after the
// gradient all-reduce; rank 0 names an outlier rank (or says the vote is inconclusive) in the log.
// [fault] progress: this rank's progress record for `atoll watch` while the loop runs; marked done
// only by finish() (an exception leaves it as it was, and the watcher sees the process gone).
class ProgressRecordGuard {
 public:
  ProgressRecordGuard(const TrainOptions& o, int rank, int world);
  ~ProgressRecordGuard();
  void finish() { finished_ = true; }

 private:
  bool on_ = false, finished_ = false;
};

class SignatureHook {
 public:
  void step_start(const nn::Model& model);
  void backward_done();  // before the gradient wait: the rank's own compute time ends here
  void check(comm::Communicator& comm, int64_t step, double loss, const nn::Model& model);
  int64_t detections() const { return detections_; }

 private:
  std::chrono::steady_clock::time_point t0_, t1_;
  uint64_t param_hash_ = 0, exchanges_ = 0;
  int64_t detections_ = 0;
};

// A replica of fault-tolerant data parallelism inside the trainer: the data-parallel strategy runs
// on one process (no communicator); the hook averages gradients and loss over each step's quorum
// and heals the whole training state (weights, optimizer state, sampling RNG, data position) from
// a peer as one blob. Each replica reads shard RANK of WORLD_SIZE and keeps its own run directory
// (RUN_DIR/replica<RANK>) for metrics and disk checkpoints.
// DeadPool ([fault] snapshot_every, spare): the state goes to the next replica's memory every N
// committed steps; a spare (RANK = its spare id) waits in the lighthouse's pool, becomes the slot it
// is given (RUN_DIR/replica<SLOT>.spare<ID>), restores the slot's snapshot and heals the rest.
class QuorumHook {
 public:
  QuorumHook(TrainOptions& o, const comm::DistEnv& env);
  ~QuorumHook();  // after a normal end, waits for the other replicas to finish (QuorumReplica::finish)
  TaskEnv task_env() const { return {id_, replicas_, nullptr}; }
  void begin(int64_t start, nn::Model& model, parallel::DataParallel& dp, Task& task, Rng& sample_rng);
  // One step: false when it was discarded (redo: `step` is set so that the loop's ++step lands on
  // the step to run); true when it committed (`step` is the committed step's index, `loss` the
  // quorum's mean loss).
  bool step(int64_t& step, const std::function<double()>& compute, double& loss, const std::function<void()>& apply);

 private:
  std::string save() const;
  std::string rest() const;  // RNG and data position, JSON
  void load(const std::string& blob);
  void peer_snapshot();
  int id_ = 0, replicas_ = 1;
  int64_t every_ = 0;  // [fault] snapshot_every
  int64_t copies_ = 1;  // [fault] snapshot_copies
  bool spare_ = false;
  std::unique_ptr<resilience::PeerCheckpointer> pc_;
  resilience::QuorumOptions qo_;
  std::unique_ptr<resilience::QuorumReplica> replica_;
  resilience::ReplicaState state_;
  nn::Model* model_ = nullptr;
  parallel::DataParallel* dp_ = nullptr;
  Task* task_ = nullptr;
  Rng* rng_ = nullptr;
};

}  // namespace atl
