// SCOUT's in-situ replay inside the training loop ([fault] replay_every; issue 14 item 3, after
// SCOUT's replay-based confirmation; the library is resilience/scout_replay.h).
//
// On an audited step every rank, before its own forward/backward, recomputes the shares of the
// `replay_witnesses` data ranks before it (their micro-batches read again from the step's data
// position, from the weights the step starts from, into the gradient buffer that the live step
// then zeroes). Its own share runs with the gradient sync held back, so that the local gradient
// can be hashed before the all-reduce; the buckets are then reduced in finish_backward as usual
// (the same buckets in the same order: the reduced gradient is bitwise the unaudited one). One
// all-gather of the hashes and times then gives each share 1 + witnesses votes:
//  - a share whose owner was outvoted is silent data corruption that entered the reduced
//    gradient; with replay_repair (default) the step is discarded and computed once more (data
//    rewound, replays again), and a second outvote stops the run naming the rank before the
//    update is applied; without repair the corruption enters the weights and taints the chain
//    of certificates;
//  - a witness outvoted on its replay is named too (its node computes wrongly), but the update
//    is clean;
//  - stragglers and slow shares are reported as the library judges them.
// Checkpoints carry the chain's `replay_certificate`; [fault] resume_certified makes --resume take
// the newest checkpoint whose chain is clean (resilience::choose_certified_checkpoint).
// The replay is bitwise only among equal ranks: the same build, ISA path and thread count (the
// pre-run gate checks the config); it is DDP only, where every rank holds the whole model.
#pragma once
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "nn/model.h"
#include "parallel/data_parallel.h"
#include "resilience/scout_replay.h"
#include "train/task.h"
#include "train/trainer.h"

namespace atl {

class ReplayHook {
 public:
  ReplayHook(const TrainOptions& o, comm::Communicator& comm);
  bool due(int64_t step) const { return every_ > 0 && (step + 1) % every_ == 0; }
  // Before an audited step's live compute: remembers the data position and recomputes the witnessed
  // shares (leaves garbage in the gradient buffer: the live compute zeroes it).
  void replay_witnesses(nn::Model& model, parallel::DataParallel& dp, Task& task, int64_t grad_accum);
  void own_start();
  // After the own share's backward, before the all-reduce: its hash and time. `step` (1-based) and
  // attempt drive the test injection ([fault] flip_grad_at_step), which flips one bit of the share.
  void own_done(nn::Model& model, int64_t step, int attempt);
  // Collective: the votes. True when the step may be applied; false when it must be computed again
  // (the caller rewinds the data to data_position()); throws when corruption persisted.
  bool judge(int64_t step, int attempt, const std::string& last_checkpoint);
  const nlohmann::json& data_position() const { return position_; }
  // The step's record for metrics.jsonl (empty when nothing was found and nothing redone).
  nlohmann::json record() const { return record_; }
  double replay_ms() const { return replay_ms_; }
  resilience::CertificateChain& chain() { return chain_; }

 private:
  int64_t every_ = 0;
  resilience::ReplayOptions ro_;
  bool repair_ = true;
  int64_t flip_step_ = 0, flip_rank_ = 0;
  bool flip_every_attempt_ = false;
  comm::Communicator& comm_;
  nlohmann::json position_, record_;
  std::vector<std::pair<int, resilience::ShareRun>> replays_;
  resilience::ShareRun own_;
  std::chrono::steady_clock::time_point t_own_;
  double replay_ms_ = 0;
  resilience::CertificateChain chain_;
};

}  // namespace atl
