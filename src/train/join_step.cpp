#include "train/join_step.h"

#include "core/error.h"
#include "core/log.h"

namespace atl {

JoinStep::JoinStep(Task& task, parallel::DataParallel& dp, comm::Communicator* comm, int64_t grad_accum)
    : task_(task), dp_(dp), comm_(comm), accum_(grad_accum), world_(comm ? comm->size() : 1) {
  // Coded ranks never wait for each other, so they cannot count who has data; a group that ran out
  // would leave the others short of messages.
  ATOLL_CHECK(dp.name() != "coded", "data.epochs (finite data, joined ranks) does not run under parallel.strategy = "
              "'coded': its ranks do not meet at each step to count who has data");
  // Every rank's count, once, for the log: how unevenly the data will run out.
  Tensor mine = Tensor::empty({1}, DType::i64), all = Tensor::empty({world_}, DType::i64);
  static_cast<int64_t*>(mine.raw())[0] = task_.batches_left() / accum_;
  if (comm_) comm_->all_gather(mine, all);
  else all = mine;
  std::string counts;
  for (int r = 0; r < world_; ++r) counts += fmt::format("{}{}", r ? ", " : "", static_cast<int64_t*>(all.raw())[r]);
  log::info("join: finite data, steps of data per rank: {}; a rank that runs out joins the others' steps with "
            "zero contribution until every rank has", counts);
}

int JoinStep::count(bool has) { return dp_.join(has); }

bool JoinStep::begin() {
  joined_ = task_.batches_left() < accum_;
  // The count all_done() made after the previous step holds for this one (the data did not move
  // since), and its DataParallel::join call set the gradients' divisor: no second collective.
  active_ = next_active_ >= 0 ? next_active_ : count(!joined_);
  next_active_ = -1;
  return active_ > 0;
}

const Batch& JoinStep::next_batch(const std::function<const Batch&()>& take) {
  if (joined_ && last_) return *last_;
  last_ = &take();  // a rank with no batch at all still needs one to shadow the step
  return *last_;
}

double JoinStep::average_loss(double local) {
  // (had data, loss as two floats) per rank: the loss stays accurate to ~1e-14.
  Tensor mine = Tensor::empty({3}), all = Tensor::empty({3 * world_});
  mine.f32()[0] = joined_ ? 0.f : 1.f;
  mine.f32()[1] = float(local);
  mine.f32()[2] = float(local - double(mine.f32()[1]));
  if (comm_) comm_->all_gather(mine, all);
  else all = mine;
  losses_.assign(size_t(world_), 0.0);
  had_.assign(size_t(world_), false);
  double sum = 0;
  int n = 0;
  for (int r = 0; r < world_; ++r) {
    const float* p = all.f32() + 3 * r;
    had_[size_t(r)] = p[0] > 0.5f;
    losses_[size_t(r)] = double(p[1]) + double(p[2]);
    if (had_[size_t(r)]) {
      sum += losses_[size_t(r)];
      ++n;
    }
  }
  ATOLL_CHECK(n == active_, "join: {} ranks sent a loss with data, {} said they had data", n, active_);
  return n > 0 ? sum / double(n) : 0.0;
}

bool JoinStep::all_done() {
  next_active_ = count(task_.batches_left() >= accum_);
  return next_active_ == 0;
}

nlohmann::json JoinStep::record() const {
  nlohmann::json l = nlohmann::json::array();
  for (int r = 0; r < world_; ++r) l.push_back(had_.empty() || had_[size_t(r)] ? nlohmann::json(losses_[size_t(r)]) : nlohmann::json());
  return {{"join_active", active_}, {"join_losses", l}};
}

}  // namespace atl
