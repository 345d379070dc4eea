// DiLoCo; see diloco.h.
#include "lowcomm/diloco.h"

#include <fmt/format.h>

namespace atl::lowcomm {

using Clock = std::chrono::steady_clock;

std::string DiLoCo::describe() const {
  return fmt::format("{} over {} islands, H = {}, outer {}SGD lr {} momentum {}, exchange {}, sync {}", c_.method, islands_,
                     c_.inner_steps, c_.nesterov && c_.outer_momentum > 0 ? "Nesterov " : "", c_.outer_lr,
                     c_.outer_momentum, describe_exchange(c_.codec), sched_->describe());
}

nlohmann::json DiLoCo::sync(int64_t step) {
  if (!sync_due(step)) return nullptr;
  auto t0 = Clock::now();
  const Tensor local = local_values();  // the model (ZeRO-3: this rank's shards of it)
  const int64_t n = local.numel();
  if (!delta_.defined()) delta_ = Tensor::empty({n});
  float* d = delta_.f32();
  const float *x = local.f32(), *g = global_.f32();
  for (int64_t i = 0; i < n; ++i) d[i] = g[i] - x[i];
  if (mats_.empty()) mats_ = matrices_within(local_ranges());
  start_average(delta_, "pseudo_gradient", mats_)();
  agree_over_tp(delta_, {{0, flat_.numel()}}, "pseudo_gradient");
  agree_over_pp(delta_);
  merge(delta_);
  outer_sgd(global_.f32(), mom_.f32(), delta_.f32(), n, c_);
  set_local_values(global_);
  ++outer_steps_;
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  return record("outer", n, s, s);
}

std::unique_ptr<LowComm> make_diloco(const LowCommConfig& c, parallel::Mesh& mesh, comm::Communicator* world,
                                     Config& cfg) {
  return std::make_unique<DiLoCo>(c, mesh, world, cfg);
}

}  // namespace atl::lowcomm
