// SCOUT's in-situ replay inside the training loop (see replay_hook.h; "SCOUT" in
// ../shared/papers/abstracts.txt).
#include "train/replay_hook.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "autograd/graph.h"
#include "autograd/weight_cast_cache.h"
#include "core/log.h"
#include "resilience/step_signature.h"

namespace atl {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
uint64_t grad_hash(const nn::Model& model) {
  const Tensor& g = model.flat_grads();
  return resilience::buffer_hash(g.raw(), size_t(g.nbytes()));
}
std::string ranks(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}
}  // namespace

ReplayHook::ReplayHook(const TrainOptions& o, comm::Communicator& comm)
    : every_(o.fault_replay_every),
      repair_(o.fault_replay_repair),
      flip_step_(o.fault_flip_grad_at_step),
      flip_rank_(o.fault_flip_grad_rank),
      flip_every_attempt_(o.fault_flip_grad_every_attempt),
      comm_(comm) {
  ro_.witnesses = int(std::min<int64_t>(o.fault_replay_witnesses, comm.size() - 1));
}

void ReplayHook::replay_witnesses(nn::Model& model, parallel::DataParallel& dp, Task& task, int64_t grad_accum) {
  position_ = task.data_state();
  replays_.clear();
  const auto t0 = Clock::now();
  const int n = comm_.size(), r = comm_.rank();
  dp.set_sync(false);  // a replay's gradients are this rank's alone: nothing is reduced
  WeightCastScope casts;  // as the live step (bf16 weight copies made once)
  for (int k = 0; k < ro_.witnesses; ++k) {
    const int share = ((r - 1 - k) % n + n) % n;  // the order cross_replay expects
    task.start_replay(position_, share, n);
    const auto t = Clock::now();
    dp.zero_grad();
    for (int64_t m = 0; m < grad_accum; ++m) {
      Tensor loss = task.loss(model, task.next_replay_batch());
      backward(loss, 1.f / float(grad_accum));
    }
    replays_.push_back({share, {grad_hash(model), ms_since(t)}});
  }
  replay_ms_ = ms_since(t0);
}

void ReplayHook::own_start() { t_own_ = Clock::now(); }

void ReplayHook::own_done(nn::Model& model, int64_t step, int attempt) {
  if (flip_step_ == step && comm_.rank() == flip_rank_ && (attempt == 0 || flip_every_attempt_)) {
    // The test's silent data corruption: one mantissa bit of one gradient element of this rank's
    // share, after its backward and before the all-reduce (no check downstream sees it).
    const Tensor& g = model.flat_grads();
    uint32_t bits;
    float* p = g.f32() + g.numel() / 2;
    std::memcpy(&bits, p, 4);
    bits ^= 1u << 22;
    std::memcpy(p, &bits, 4);
    log::warn("fault.flip_grad_at_step: rank {} flipped a bit of its gradient share at step {}", comm_.rank(), step);
  }
  own_ = {grad_hash(model), ms_since(t_own_)};
}

bool ReplayHook::judge(int64_t step, int attempt, const std::string& last_checkpoint) {
  resilience::ReplayFinding f = resilience::cross_replay(
      comm_, own_,
      [&](int share) {
        for (auto& [s, run] : replays_)
          if (s == share) return run;
        fail("replay: share {} was not replayed on rank {}", share, comm_.rank());
      },
      ro_);
  const bool lead = comm_.rank() == 0;
  if (attempt == 0) record_ = nlohmann::json();
  const bool found = !f.clean() || !f.slow_shares.empty();
  if (found) {
    nlohmann::json j = {{"finding", f.message}, {"sdc", f.sdc}, {"corrupt_shares", f.corrupt_shares},
                        {"stragglers", f.stragglers}, {"slow_shares", f.slow_shares}, {"inconclusive", f.inconclusive}};
    if (attempt == 0)
      record_ = j;
    else
      record_["again"] = j;
  }
  const bool bad = !f.corrupt_shares.empty() || !f.inconclusive.empty();
  if (!bad) {
    if (attempt > 0) record_["redone"] = attempt;
    if (found && lead) log::warn("step {} | {}", step, f.message);
    if (attempt > 0 && lead) log::info("step {} | replay: the recomputed step reproduced on every rank; applied", step);
    chain_.audited(step, f);
    return true;
  }
  const std::string who = !f.corrupt_shares.empty() ? "rank(s) " + ranks(f.corrupt_shares)
                                                    : "an undecided rank (no strict majority: shares " + ranks(f.inconclusive) + ")";
  if (repair_ && attempt == 0) {
    if (lead) log::warn("step {} | {}; a share of the step's reduced gradient did not reproduce{}: the step is "
                        "discarded and computed again",
                        step, f.message, f.corrupt_shares.empty() ? " (or could not be judged)" : "");
    return false;
  }
  if (repair_)
    fail("replay: step {}: the gradient share of {} did not reproduce, again after the step was computed a second "
         "time: a persistent fault on that node. Stopped before the update (nothing of this step was applied; last "
         "checkpoint: {}). {}",
         step, who, last_checkpoint.empty() ? "none" : last_checkpoint, f.message);
  if (lead) log::warn("step {} | {}; fault.replay_repair = false: the update is applied as it is, and this run's "
                      "later checkpoints are not certified", step, f.message);
  chain_.audited(step, f);
  return true;
}

}  // namespace atl
