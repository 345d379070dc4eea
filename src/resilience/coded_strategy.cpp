#include "resilience/coded_strategy.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "optim/clip.h"

namespace atl::resilience {

CodedStrategy::CodedStrategy(nn::Model& model, comm::Communicator& world, int stragglers,
                             std::unique_ptr<Optimizer> opt, const AdamWConfig& ac, int delay_rank, double delay_ms)
    : DataParallel(model, nullptr), n_(world.size()), s_(stragglers), me_(world.rank()), delay_rank_(delay_rank),
      delay_ms_(delay_ms) {
  ATOLL_CHECK(s_ >= 1 && s_ < n_ && n_ % (s_ + 1) == 0,
              "parallel.strategy = 'coded': parallel.coded_stragglers = {} needs (s + 1) to divide the {} ranks "
              "(fractional repetition: groups of s + 1 ranks hold the same data) and s < {}",
              s_, n_, n_);
  opt_ = opt ? std::move(opt) : std::make_unique<AdamW>(model.param_refs(), ac);
  world.broadcast(model.flat_values(), 0);  // one starting point, as DDP
  ex_ = std::make_unique<CodedExchange>(world);
  missing_.assign(size_t(n_), 0);
  log::info("coded data parallel: {} ranks in {} groups of {}, any {} messages decode the gradient", n_,
            n_ / (s_ + 1), s_ + 1, n_ - s_);
}

CodedStrategy::~CodedStrategy() {
  std::string without;
  for (int w = 0; w < n_; ++w)
    if (missing_[size_t(w)] > 0) without += fmt::format("{}rank {} at {}", without.empty() ? "" : ", ", w, missing_[size_t(w)]);
  log::info("coded data parallel: rank {}: {} steps decoded{}", me_, t_,
            without.empty() ? " with every rank's message in" : ", without the message of " + without);
}

void CodedStrategy::zero_grad() { model_.zero_grad(); }

void CodedStrategy::finish_backward() {
  const int64_t t = t_++;
  const Tensor& g = model_.flat_grads();
  const int64_t len = g.numel();
  const int k = n_ - s_;
  // Behind: the others' messages for this step are in already; the straggler's slowness is skipped.
  const bool behind = int(ex_->peek(t).size()) >= k;
  if (me_ == delay_rank_ && delay_ms_ > 0 && !behind)
    std::this_thread::sleep_for(std::chrono::microseconds(int64_t(delay_ms_ * 1000)));
  if (!behind) ex_->post(t, std::vector<float>(g.f32(), g.f32() + len));
  auto t0 = std::chrono::steady_clock::now();
  CodedExchange::Messages in = ex_->collect(t, k, std::chrono::seconds(300));
  wait_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // One message per group, its lowest rank in (a group's messages are bitwise equal), summed in
  // group order, then the mean over groups.
  const int groups = n_ / (s_ + 1);
  decoded_.clear();
  float* out = g.f32();
  for (int grp = 0; grp < groups; ++grp) {
    const std::vector<float>* m = nullptr;
    for (int w = grp * (s_ + 1); w < (grp + 1) * (s_ + 1) && !m; ++w)
      if (auto it = in.find(w); it != in.end()) {
        m = &it->second;
        decoded_.push_back(w);
      }
    ATOLL_CHECK(m && int64_t(m->size()) == len, "coded data parallel: step {}: no message of group {} among {} in",
                t, grp, in.size());
    if (grp == 0) std::memcpy(out, m->data(), size_t(len) * 4);
    else
      for (int64_t i = 0; i < len; ++i) out[i] += (*m)[size_t(i)];
  }
  if (groups > 1) {
    const float inv = 1.f / float(groups);
    for (int64_t i = 0; i < len; ++i) out[i] *= inv;
  }
  for (int w = 0; w < n_; ++w)
    if (!in.count(w)) ++missing_[size_t(w)];
  ex_->forget_before(t);
}

double CodedStrategy::grad_norm() { return atl::grad_norm(model_.flat_grads()); }

void CodedStrategy::step(const StepContext& ctx) { opt_->step(ctx); }

void CodedStrategy::full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                               std::vector<std::pair<std::string, Tensor>>& opt_state) {
  model_sd = model_.state_dict();
  opt_->save_state(opt_state, "");
}

void CodedStrategy::load_full_state(const std::vector<std::pair<std::string, Tensor>>& model_sd,
                                    const TensorFile& opt_state, const std::string& what) {
  model_.load_state_dict(model_sd, what);
  opt_->load_state(opt_state, "");
}

namespace {
struct Register {
  Register() {
    parallel::strategy_registry().add(
        "coded", {false, [](nn::Model& model, comm::Communicator* comm, const parallel::ParallelConfig& pc,
                            const AdamWConfig& ac, std::unique_ptr<Optimizer> opt, const parallel::ShardedOptimizerFactory&,
                            parallel::Mesh*) -> std::unique_ptr<parallel::DataParallel> {
                    ATOLL_CHECK(comm && comm->size() > 1, "parallel.strategy = 'coded' is gradient coding over "
                                "the ranks of a distributed job (`atoll launch`)");
                    return std::make_unique<CodedStrategy>(model, *comm, pc.coded_stragglers, std::move(opt), ac,
                                                           pc.coded_delay_rank, pc.coded_delay_ms);
                  }});
  }
} reg;
}  // namespace

}  // namespace atl::resilience
