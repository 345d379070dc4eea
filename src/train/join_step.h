// Join for data that runs out unevenly (PyTorch's Join context manager; issue 14 item 6, the B300
// field report's uneven-packing deadlock): with finite data ([data] epochs > 0, Task::batches_left)
// a rank whose data has run out does not leave the loop — its peers would wait in their next
// gradient all-reduce for ever — but shadows every step: forward and backward on its last batch
// with a zero backward seed, so it issues the same collectives and contributes zero gradient.
// DataParallel::join counts the ranks with data, and the gradients and the logged loss are the
// means over those ranks; every rank applies the same update and stays bitwise equal. The run ends,
// with a checkpoint, after the step where the last rank's data ran out.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>

#include "comm/communicator.h"
#include "parallel/data_parallel.h"
#include "train/task.h"

namespace atl {

class JoinStep {
 public:
  JoinStep(Task& task, parallel::DataParallel& dp, comm::Communicator* comm, int64_t grad_accum);
  // Collective, before a step: false when no rank has data for it.
  bool begin();
  bool joined() const { return joined_; }  // this rank shadows the step
  float seed() const { return joined_ ? 0.f : 1.f; }
  // This rank's next micro-batch, or, once joined, the last one again.
  const Batch& next_batch(const std::function<const Batch&()>& take);
  // Collective: the mean of each rank's loss over the ranks with data (every rank gets it).
  double average_loss(double local);
  // Collective, after a step: true when no rank has data for another (the run ends here).
  bool all_done();
  nlohmann::json record() const;  // join_active, join_losses (null for a joined rank)

 private:
  int count(bool has);
  Task& task_;
  parallel::DataParallel& dp_;
  comm::Communicator* comm_;
  int64_t accum_;
  int world_ = 1, active_ = 0, next_active_ = -1;
  bool joined_ = false;
  const Batch* last_ = nullptr;
  std::vector<double> losses_;
  std::vector<bool> had_;
};

}  // namespace atl
