// Periodic Row-wise Muon on row-sharded momentum; see prmuon_sharded.h.
#include "parallel/optim/prmuon_sharded.h"
#include "optim/param_groups.h"
#include "parallel/optim/placement.h"
#include "optim/optim_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace atl::parallel {

RowBlock row_block(int64_t rows, int rank, int world) {
  int64_t per = (rows + world - 1) / world;
  return {std::min(rows, per * rank), std::min(rows, per * (rank + 1))};
}

RowPacking::RowPacking(const std::vector<optim::MatDims>& dims, int world, int64_t bucket_elems)
    : bucket_of(dims.size()), within(dims.size()) {
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t blk = (dims[i].rows + world - 1) / world * dims[i].cols;
    if (buckets.empty() || (!buckets.back().mats.empty() && (buckets.back().chunk + blk) * world > bucket_elems))
      buckets.emplace_back();
    auto& b = buckets.back();
    within[i] = b.chunk;
    b.chunk += blk;
    b.mats.push_back(i);
    bucket_of[i] = buckets.size() - 1;
  }
}

PrMuonSharded::PrMuonSharded(std::vector<ParamRef> params, PrMuonShardedConfig cfg, comm::Communicator* comm)
    : params_(std::move(params)), cfg_(std::move(cfg)), comm_(comm) {
  ATOLL_CHECK(cfg_.prm.period >= 1, "prmuon (sharded): period K must be at least 1, got {}", cfg_.prm.period);
  ATOLL_CHECK(cfg_.prm.normalize_rows, "prmuon (sharded): only axis = \"rows\" works on row-sharded momentum; "
              "use the single-rank prmuon for axis = \"cols\"");
  rank_ = comm_ ? comm_->rank() : 0;
  world_ = comm_ ? comm_->size() : 1;
  std::vector<double> cost;
  std::vector<int64_t> numel;
  for (auto& p : params_) {
    ATOLL_CHECK(p.value.dim() >= 2, "prmuon (sharded): parameter {} has shape {}; it only takes matrices", p.name,
                shape_str(p.value.shape()));
    optim::check_param(p, "prmuon (sharded)");
    auto d = optim::mat_dims(p.value);
    dims_.push_back(d);
    mine_.push_back(row_block(d.rows, rank_, world_));
    momentum_.emplace_back(size_t(mine_.back().size() * d.cols), 0.f);
    cost.push_back(optim::ns_flops(d.rows, d.cols, cfg_.prm.muon.ns));
    numel.push_back(p.value.numel());
  }
  rows_ = RowPacking(dims_, world_, cfg_.bucket_elems);
  fit_.assign(params_.size(), 1.f);
  owners_ = OwnerPacking(numel, assign_owners_lpt(cost, world_), world_);
}

int64_t PrMuonSharded::state_elems() const {
  int64_t n = 0;
  for (auto& m : momentum_) n += int64_t(m.size());
  return n;
}

void PrMuonSharded::gather_rows(const std::vector<const float*>& src, const std::vector<float*>& dst) const {
  if (world_ == 1) {
    for (size_t i = 0; i < params_.size(); ++i)
      std::memmove(dst[i], src[i], size_t(dims_[i].rows * dims_[i].cols) * sizeof(float));
    return;
  }
  std::vector<Tensor> send, recv;
  std::vector<comm::WorkPtr> work;
  for (auto& b : rows_.buckets) {  // every bucket in flight before the first wait
    send.push_back(Tensor::zeros({b.chunk}));
    recv.push_back(Tensor::empty({world_ * b.chunk}));
    for (size_t i : b.mats)
      std::memcpy(send.back().f32() + rows_.within[i], src[i], size_t(mine_[i].size() * dims_[i].cols) * sizeof(float));
    work.push_back(comm_->all_gather_async(send.back(), recv.back()));
  }
  for (size_t bi = 0; bi < rows_.buckets.size(); ++bi) {
    work[bi]->wait();
    const auto& b = rows_.buckets[bi];
    for (int r = 0; r < world_; ++r)
      for (size_t i : b.mats) {
        RowBlock rb = row_block(dims_[i].rows, r, world_);
        std::memmove(dst[i] + rb.lo * dims_[i].cols, recv[bi].f32() + r * b.chunk + rows_.within[i],
                     size_t(rb.size() * dims_[i].cols) * sizeof(float));
      }
  }
}

void PrMuonSharded::step(const StepContext& ctx) {
  ++steps_;
  const auto& mc = cfg_.prm.muon;
  const float lr = mc.lr * ctx.lr_scale;
  const bool refresh = is_refresh(steps_);
  const size_t np = params_.size();

  // This rank's rows of the averaged gradient.
  std::vector<const float*> g(np);
  std::vector<Tensor> reduced;
  if (cfg_.reduce_grads && world_ > 1) {
    std::vector<Tensor> full;
    std::vector<comm::WorkPtr> work;
    for (auto& b : rows_.buckets) {
      full.push_back(Tensor::zeros({world_ * b.chunk}));
      reduced.push_back(Tensor::empty({b.chunk}));
      for (int r = 0; r < world_; ++r)
        for (size_t i : b.mats) {
          RowBlock rb = row_block(dims_[i].rows, r, world_);
          std::memcpy(full.back().f32() + r * b.chunk + rows_.within[i], params_[i].grad.f32() + rb.lo * dims_[i].cols,
                      size_t(rb.size() * dims_[i].cols) * sizeof(float));
        }
      work.push_back(comm_->reduce_scatter_async(full.back(), reduced.back(), comm::ReduceOp::avg));
    }
    for (auto& w : work) w->wait();
    for (size_t i = 0; i < np; ++i) g[i] = reduced[rows_.bucket_of[i]].f32() + rows_.within[i];
  } else {
    for (size_t i = 0; i < np; ++i) g[i] = params_[i].grad.f32() + mine_[i].lo * dims_[i].cols;
  }

  std::vector<std::vector<float>> u(np);
  for (size_t i = 0; i < np; ++i) {
    int64_t n = mine_[i].size() * dims_[i].cols;
    u[i].resize(size_t(n));
    optim::muon_momentum(momentum_[i].data(), g[i], u[i].data(), n, mc.momentum, mc.nesterov, ctx.grad_scale);
  }

  if (!refresh) {
    std::vector<const float*> src(np);
    std::vector<float*> dst(np);
    for (size_t i = 0; i < np; ++i) {
      auto d = dims_[i];
      float gain = cfg_.prm.fit_scale ? fit_[i] : float(std::sqrt(double(std::min(d.rows, d.cols)) / double(d.rows)));
      optim::normalize_slices(u[i].data(), mine_[i].size(), d.cols, true, cfg_.prm.eps, gain);
      float* w = params_[i].value.f32() + mine_[i].lo * d.cols;
      optim::apply_scaled_update(w, u[i].data(), mine_[i].size() * d.cols, lr,
                                 optim::update_scale(mc.scale, d.rows, d.cols, mc.layout), mc.weight_decay);
      src[i] = w;
      dst[i] = params_[i].value.f32();
    }
    gather_rows(src, dst);  // ZeRO's parameter all-gather: every rank's rows to everyone
    return;
  }

  // Refresh: full momentum matrices, orthogonalized by their owners, updates shared.
  std::vector<std::vector<float>> full(np);
  std::vector<const float*> src(np);
  std::vector<float*> dst(np);
  for (size_t i = 0; i < np; ++i) {
    full[i].resize(size_t(dims_[i].rows * dims_[i].cols));
    src[i] = u[i].data();
    dst[i] = full[i].data();
  }
  gather_rows(src, dst);
  Tensor send = Tensor::zeros({owners_.chunk});
  const int64_t base = int64_t(rank_) * owners_.chunk;
  Tensor fit = Tensor::zeros({std::max<int64_t>(int64_t(np), 1)});
  for (size_t i = 0; i < np; ++i)
    if (owners_.owner[i] == rank_) {
      float* o = send.f32() + (owners_.offset[i] - base);
      optim::orthogonalize(full[i].data(), o, dims_[i].rows, dims_[i].cols, mc.ns);
      if (cfg_.prm.fit_scale)  // the single-rank fit, from the whole matrices the owner holds
        fit.f32()[i] =
            optim::row_fit(optim::row_fit_parts(o, full[i].data(), dims_[i].rows, dims_[i].cols, true, cfg_.prm.eps));
    }
  if (cfg_.prm.fit_scale) {  // only the owner's entry is non-zero: the sum shares the fits exactly
    if (world_ > 1 && np > 0) comm_->all_reduce(fit, comm::ReduceOp::sum);
    for (size_t i = 0; i < np; ++i) fit_[i] = fit.f32()[i];
  }
  Tensor all = send;
  if (world_ > 1) {
    all = Tensor::empty({world_ * owners_.chunk});
    comm_->all_gather(send, all);
  }
  for (size_t i = 0; i < np; ++i) {
    auto d = dims_[i];
    optim::apply_scaled_update(params_[i].value.f32(), all.f32() + owners_.offset[i], d.rows * d.cols, lr,
                               optim::update_scale(mc.scale, d.rows, d.cols, mc.layout), mc.weight_decay);
  }
}

void PrMuonSharded::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", optim::step_tensor(steps_));
  std::vector<Tensor> full;
  std::vector<const float*> src;
  std::vector<float*> dst;
  for (size_t i = 0; i < params_.size(); ++i) {
    full.push_back(Tensor::empty(params_[i].value.shape()));
    src.push_back(momentum_[i].data());
    dst.push_back(full.back().f32());
  }
  gather_rows(src, dst);  // collective
  for (size_t i = 0; i < params_.size(); ++i) out.emplace_back(prefix + params_[i].name + ".momentum", full[i]);
  if (cfg_.prm.fit_scale)
    for (size_t i = 0; i < params_.size(); ++i)
      out.emplace_back(prefix + params_[i].name + ".row_fit", Tensor::full({1}, fit_[i]));
}

void PrMuonSharded::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = optim::read_step(f, prefix + "step");
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor m = Tensor::empty(params_[i].value.shape());
    optim::load_checked(m, f, prefix + params_[i].name + ".momentum");
    std::memcpy(momentum_[i].data(), m.f32() + mine_[i].lo * dims_[i].cols, momentum_[i].size() * sizeof(float));
    if (cfg_.prm.fit_scale) {
      Tensor c = Tensor::empty({1});
      optim::load_checked(c, f, prefix + params_[i].name + ".row_fit");
      fit_[i] = c.f32()[0];
    }
  }
}

namespace {
PlacementRegistrar<ReplicatedPlacement> reg(
    replicated_placements(), "prmuon",
    {nullptr,
     [](Config& c, std::vector<ParamRef>& ps, comm::Communicator* comm, std::string& note) -> std::unique_ptr<Optimizer> {
       PeriodicRowMuonConfig pc = prmuon_config_from(c, "optim.prmuon");
       if (!comm || !pc.normalize_rows) return nullptr;  // column norms span the row shards: keep it replicated
       note = " (PRMuon momentum sharded by rows, refreshes orthogonalized by owner ranks)";
       return std::make_unique<PrMuonSharded>(ps, PrMuonShardedConfig{pc, /*reduce_grads=*/false}, comm);
     },
     "PRMuon then shards its momentum by rows"});
}  // namespace

}  // namespace atl::parallel
