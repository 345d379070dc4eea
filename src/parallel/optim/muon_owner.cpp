// DMuon-style ownership for Muon; see muon_owner.h.
#include "parallel/optim/muon_owner.h"
#include "optim/param_groups.h"
#include "parallel/optim/placement.h"
#include "optim/optim_util.h"

#include <algorithm>
#include <cstring>
#include <numeric>

namespace atl::parallel {

std::vector<int> assign_owners_lpt(const std::vector<double>& cost, int world) {
  ATOLL_CHECK(world >= 1, "assign_owners_lpt: world size must be at least 1, got {}", world);
  std::vector<size_t> order(cost.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<double> load(size_t(world), 0.0);
  std::vector<int> owner(cost.size(), 0);
  for (size_t i : order) {
    int best = int(std::min_element(load.begin(), load.end()) - load.begin());  // first minimum
    owner[i] = best;
    load[size_t(best)] += cost[i];
  }
  return owner;
}

OwnerPacking::OwnerPacking(const std::vector<int64_t>& numel, std::vector<int> owners, int world)
    : owner(std::move(owners)), offset(numel.size()), load(size_t(world), 0) {
  std::vector<int64_t> within(numel.size());
  for (size_t i = 0; i < numel.size(); ++i) {
    within[i] = load[size_t(owner[i])];
    load[size_t(owner[i])] += numel[i];
  }
  chunk = std::max<int64_t>(1, *std::max_element(load.begin(), load.end()));
  for (size_t i = 0; i < numel.size(); ++i) offset[i] = int64_t(owner[i]) * chunk + within[i];
}

double OwnerPacking::padding_fraction() const {
  int64_t total = std::accumulate(load.begin(), load.end(), int64_t(0));
  double cap = double(chunk) * double(load.size());
  return (cap - double(total)) / cap;
}

MuonOwner::MuonOwner(std::vector<ParamRef> params, MuonOwnerConfig cfg, comm::Communicator* comm)
    : params_(std::move(params)), cfg_(std::move(cfg)), comm_(comm) {
  rank_ = comm_ ? comm_->rank() : 0;
  world_ = comm_ ? comm_->size() : 1;
  std::vector<double> cost;
  std::vector<int64_t> numel;
  for (auto& p : params_) {
    ATOLL_CHECK(p.value.dim() >= 2, "muon (distributed): parameter {} has shape {}; Muon only takes matrices",
                p.name, shape_str(p.value.shape()));
    optim::check_param(p, "muon (distributed)");
    auto d = optim::mat_dims(p.value);
    cost.push_back(optim::ns_flops(d.rows, d.cols, cfg_.muon.ns));
    numel.push_back(p.value.numel());
  }
  pack_ = OwnerPacking(numel, assign_owners_lpt(cost, world_), world_);
  for (size_t i = 0; i < params_.size(); ++i)
    momentum_.push_back(cfg_.reduce_grads && !owns(i) ? Tensor() : Tensor::zeros(params_[i].value.shape()));
  send_ = Tensor::zeros({pack_.chunk});
  recv_ = world_ > 1 ? Tensor::zeros({world_ * pack_.chunk}) : send_;
  if (cfg_.reduce_grads && world_ > 1) grads_ = Tensor::zeros({world_ * pack_.chunk});
}

void MuonOwner::step(const StepContext& ctx) {
  ++steps_;
  const auto& mc = cfg_.muon;
  const float lr = mc.lr * ctx.lr_scale;
  const int64_t base = int64_t(rank_) * pack_.chunk;  // my chunk's offset in the packed buffers
  // Owner-reduced: the averaged gradient of each matrix lands in its owner's chunk.
  Tensor my_grads;
  if (cfg_.reduce_grads && world_ > 1) {
    float* g = grads_.f32();
    for (size_t i = 0; i < params_.size(); ++i)
      std::memcpy(g + pack_.offset[i], params_[i].grad.f32(), size_t(params_[i].grad.numel()) * sizeof(float));
    my_grads = Tensor::empty({pack_.chunk});
    comm_->reduce_scatter(grads_, my_grads, comm::ReduceOp::avg);
  }
  std::vector<float> u;
  float* out = send_.f32();
  for (size_t i = 0; i < params_.size(); ++i) {
    const bool mine = owns(i);
    if (cfg_.reduce_grads && !mine) continue;  // neither state nor work here
    auto& p = params_[i];
    int64_t n = p.value.numel();
    const float* g = my_grads.defined() ? my_grads.f32() + (pack_.offset[i] - base) : p.grad.f32();
    u.resize(size_t(n));
    // Non-owners in replicated mode only keep their momentum current (u is scratch).
    optim::muon_momentum(momentum_[i].f32(), g, u.data(), n, mc.momentum, mc.nesterov, ctx.grad_scale);
    if (!mine) continue;
    auto d = optim::mat_dims(p.value);
    optim::orthogonalize(u.data(), out + (pack_.offset[i] - base), d.rows, d.cols, mc.ns);
  }
  if (world_ > 1) comm_->all_gather(send_, recv_);
  const float* all = recv_.f32();
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    auto d = optim::mat_dims(p.value);
    optim::apply_scaled_update(p.value.f32(), all + pack_.offset[i], p.value.numel(), lr,
                               optim::update_scale(mc.scale, d.rows, d.cols, mc.layout), mc.weight_decay);
  }
}

void MuonOwner::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", optim::step_tensor(steps_));
  if (!cfg_.reduce_grads || world_ == 1) {
    for (size_t i = 0; i < params_.size(); ++i) out.emplace_back(prefix + params_[i].name + ".momentum", momentum_[i]);
    return;
  }
  // Collective: gather every owner's momenta into full tensors.
  Tensor mine = Tensor::zeros({pack_.chunk}), all = Tensor::empty({world_ * pack_.chunk});
  const int64_t base = int64_t(rank_) * pack_.chunk;
  for (size_t i = 0; i < params_.size(); ++i)
    if (owns(i))
      std::memcpy(mine.f32() + (pack_.offset[i] - base), momentum_[i].f32(), momentum_[i].nbytes());
  comm_->all_gather(mine, all);
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor m = Tensor::empty(params_[i].value.shape());
    std::memcpy(m.f32(), all.f32() + pack_.offset[i], m.nbytes());
    out.emplace_back(prefix + params_[i].name + ".momentum", m);
  }
}

void MuonOwner::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = optim::read_step(f, prefix + "step");
  for (size_t i = 0; i < params_.size(); ++i)
    if (momentum_[i].defined()) optim::load_checked(momentum_[i], f, prefix + params_[i].name + ".momentum");
}

namespace {
// DDP with [optim] type = "muon": owners orthogonalize (optim.muon.distributed = false keeps
// every rank orthogonalizing every matrix).
PlacementRegistrar<ReplicatedPlacement> reg(
    replicated_placements(), "muon",
    {[](Config& c) { c.get_bool("optim.muon.distributed", true); },
     [](Config& c, std::vector<ParamRef>& ps, comm::Communicator* comm, std::string& note) -> std::unique_ptr<Optimizer> {
       if (!comm || !c.get_bool("optim.muon.distributed", true)) return nullptr;
       note = " (Muon matrices orthogonalized by their owner ranks)";
       return std::make_unique<MuonOwner>(ps, MuonOwnerConfig{muon_config_from(c, "optim.muon")}, comm);
     },
     "Muon's matrices then get owner ranks"});
}  // namespace

}  // namespace atl::parallel
