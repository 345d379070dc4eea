// Dion3 with slice-sharded momentum and a local or global selection scope; see dion3_dist.h.
#include "parallel/optim/dion3_dist.h"
#include "optim/param_groups.h"
#include "parallel/optim/placement.h"
#include "optim/optim_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace atl::parallel {

SelectScope parse_select_scope(const std::string& s) {
  if (s == "global") return SelectScope::global;
  if (s == "local") return SelectScope::local;
  fail("dion3: selection scope must be \"global\" or \"local\", got '{}'", s);
}

Dion3Dist::Dion3Dist(std::vector<ParamRef> params, Dion3Config cfg, SelectScope scope, comm::Communicator* comm)
    : params_(std::move(params)), cfg_(std::move(cfg)), scope_(scope), comm_(comm) {
  ATOLL_CHECK(cfg_.fraction > 0.f && cfg_.fraction <= 1.f, "dion3: fraction must be in (0, 1], got {}", cfg_.fraction);
  const auto& s = cfg_.select;
  ATOLL_CHECK(s == "rows" || s == "cols" || s == "neurons" || s == "shorter",
              "dion3: select must be rows, cols, neurons or shorter, got '{}'", s);
  rank_ = comm_ ? comm_->rank() : 0;
  world_ = comm_ ? comm_->size() : 1;
  for (auto& p : params_) {
    ATOLL_CHECK(p.value.dim() >= 2, "dion3 (distributed): parameter {} has shape {}; it only takes matrices", p.name,
                shape_str(p.value.shape()));
    optim::check_param(p, "dion3 (distributed)");
    auto d = optim::mat_dims(p.value);
    dims_.push_back(d);
    // The same rule as single-rank Dion3.
    by_rows_.push_back(dion3::selects_rows(cfg_, d));
    size_t i = dims_.size() - 1;
    mine_.push_back(row_block(nslice(i), rank_, world_));
    momentum_.emplace_back(size_t(mine_.back().size() * len(i)), 0.f);
    variance_.push_back(Tensor::zeros({nslice(i)}));
    selected_.emplace_back();
  }
}

void Dion3Dist::step(const StepContext& ctx) {
  ++steps_;
  const float lr = cfg_.lr * ctx.lr_scale;
  const size_t np = params_.size();
  const float gs = ctx.grad_scale;

  // 1. Error feedback on this rank's slices, and their L1 norms (accumulated in the same order as
  //    single-rank Dion3: along the slice, ascending).
  std::vector<int64_t> per(np), norm_off(np);
  int64_t norm_chunk = 0;
  for (size_t i = 0; i < np; ++i) {
    per[i] = (nslice(i) + world_ - 1) / world_;
    norm_off[i] = norm_chunk;
    norm_chunk += per[i];
  }
  Tensor my_norms = Tensor::zeros({std::max<int64_t>(1, norm_chunk)});
  for (size_t i = 0; i < np; ++i) {
    const float* G = params_[i].grad.f32();
    const RowBlock b = mine_[i];
    const int64_t L = len(i);
    for (int64_t s = 0; s < b.size(); ++s) {
      float* m = momentum_[i].data() + s * L;
      float norm = 0.f;
      for (int64_t j = 0; j < L; ++j) {
        m[j] += gs * G[at(i, b.lo + s, j)];
        norm += std::fabs(m[j]);
      }
      my_norms.f32()[norm_off[i] + s] = norm;
    }
  }

  // 2. Selection. Global: over all norms (all-gathered). Local: the top of this rank's block.
  //    layout[i]: the ranks' selected slices in ascending global order, slot by slot.
  Tensor all_norms;
  if (scope_ == SelectScope::global && world_ > 1) {
    all_norms = Tensor::empty({world_ * my_norms.numel()});
    comm_->all_gather(my_norms, all_norms);
  }
  std::vector<int64_t> k(np), my_slot(np), buf_off(np);
  std::vector<std::vector<int64_t>> my_sel(np);
  int64_t buf_size = 0;
  for (size_t i = 0; i < np; ++i) {
    const RowBlock b = mine_[i];
    const int64_t L = len(i);
    if (scope_ == SelectScope::global) {
      std::vector<float> norms(size_t(nslice(i)));
      for (int r = 0; r < world_; ++r) {
        RowBlock rb = row_block(nslice(i), r, world_);
        const float* src = world_ > 1 ? all_norms.f32() + r * my_norms.numel() + norm_off[i] : my_norms.f32() + norm_off[i];
        std::copy(src, src + rb.size(), norms.begin() + rb.lo);
      }
      k[i] = dion3::count(cfg_.fraction, nslice(i));
      selected_[i] = dion3::top_k(norms.data(), nslice(i), k[i]);
      auto first = std::lower_bound(selected_[i].begin(), selected_[i].end(), b.lo);
      my_slot[i] = first - selected_[i].begin();
      for (auto it = first; it != selected_[i].end() && *it < b.hi; ++it) my_sel[i].push_back(*it);
    } else {
      k[i] = 0;
      for (int r = 0; r < world_; ++r) {
        int64_t kr = dion3::count(cfg_.fraction, row_block(nslice(i), r, world_).size());
        if (r == rank_) my_slot[i] = k[i];
        k[i] += kr;
      }
      for (int64_t s : dion3::top_k(my_norms.f32() + norm_off[i], b.size(), dion3::count(cfg_.fraction, b.size())))
        my_sel[i].push_back(b.lo + s);
    }
    buf_off[i] = buf_size;
    buf_size += k[i] * L + k[i];  // the selected slices, then their indices (as floats: exact below 2^24)
  }

  // 3. One all_reduce assembles every matrix's selected slices (each rank adds its own into zeros).
  Tensor buf = Tensor::zeros({std::max<int64_t>(1, buf_size)});
  for (size_t i = 0; i < np; ++i) {
    const int64_t L = len(i);
    float* U = buf.f32() + buf_off[i];
    float* ids = U + k[i] * L;
    for (size_t t = 0; t < my_sel[i].size(); ++t) {
      int64_t slot = my_slot[i] + int64_t(t), s = my_sel[i][t] - mine_[i].lo;
      float* m = momentum_[i].data() + s * L;
      for (int64_t j = 0; j < L; ++j) {
        U[slot * L + j] = m[j];
        m[j] *= cfg_.mu;
      }
      ids[slot] = float(my_sel[i][t]);
    }
  }
  if (world_ > 1) comm_->all_reduce(buf, comm::ReduceOp::sum);

  // 4. Every rank: orthogonalize, NorMuon-normalize (replicated V) and apply, as single-rank Dion3.
  std::vector<float> O;
  for (size_t i = 0; i < np; ++i) {
    auto d = dims_[i];
    const int64_t L = len(i), ki = k[i];
    const float* U = buf.f32() + buf_off[i];
    const float* ids = U + ki * L;
    selected_[i].resize(size_t(ki));
    for (int64_t s = 0; s < ki; ++s) selected_[i][size_t(s)] = int64_t(ids[s]);
    O.resize(size_t(ki * L));
    optim::orthogonalize(U, O.data(), ki, L, cfg_.ns);
    const float renorm =
        dion3::normuon_normalize(O.data(), ki, L, selected_[i].data(), variance_[i].f32(), cfg_.beta2);
    float* W = params_[i].value.f32();
    dion3::decay(W, d.rows * d.cols, lr, cfg_.weight_decay);
    const float step = lr * optim::update_scale(cfg_.scale, d.rows, d.cols, cfg_.layout) * renorm;
    for (int64_t s = 0; s < ki; ++s)
      for (int64_t j = 0; j < L; ++j) W[at(i, selected_[i][size_t(s)], j)] -= step * O[size_t(s * L + j)];
  }
}

void Dion3Dist::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  out.emplace_back(prefix + "step", optim::step_tensor(steps_));
  // Collective: every rank's slice blocks, padded to ceil(#slices / world) slices each.
  std::vector<int64_t> off(params_.size());
  int64_t chunk = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    off[i] = chunk;
    chunk += (nslice(i) + world_ - 1) / world_ * len(i);
  }
  Tensor mine = Tensor::zeros({std::max<int64_t>(1, chunk)}), all = mine;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!momentum_[i].empty()) std::memcpy(mine.f32() + off[i], momentum_[i].data(), momentum_[i].size() * sizeof(float));
  if (world_ > 1) {
    all = Tensor::empty({world_ * mine.numel()});
    comm_->all_gather(mine, all);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor m = Tensor::empty(params_[i].value.shape());
    const int64_t L = len(i);
    for (int r = 0; r < world_; ++r) {
      RowBlock rb = row_block(nslice(i), r, world_);
      const float* src = all.f32() + r * mine.numel() + off[i];
      for (int64_t s = 0; s < rb.size(); ++s)
        for (int64_t j = 0; j < L; ++j) m.f32()[at(i, rb.lo + s, j)] = src[s * L + j];
    }
    out.emplace_back(prefix + params_[i].name + ".momentum", m);
    out.emplace_back(prefix + params_[i].name + ".variance", variance_[i]);
  }
}

void Dion3Dist::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = optim::read_step(f, prefix + "step");
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor m = Tensor::empty(params_[i].value.shape());
    optim::load_checked(m, f, prefix + params_[i].name + ".momentum");
    optim::load_checked(variance_[i], f, prefix + params_[i].name + ".variance");
    const int64_t L = len(i);
    for (int64_t s = 0; s < mine_[i].size(); ++s)
      for (int64_t j = 0; j < L; ++j) momentum_[i][size_t(s * L + j)] = m.f32()[at(i, mine_[i].lo + s, j)];
  }
}

namespace {
// Dion3's selection scope on several ranks ("global": exact single-rank Dion3; "local": top-k per
// shard, no norm exchange).
std::string scope_of(Config& c) {
  return c.get_string("optim.dion3.scope", "global", {"global", "local"});
}
PlacementRegistrar<ReplicatedPlacement> reg(
    replicated_placements(), "dion3",
    {[](Config& c) {
       if (c.has("optim.dion3.scope")) scope_of(c);
     },
     [](Config& c, std::vector<ParamRef>& ps, comm::Communicator* comm, std::string& note) -> std::unique_ptr<Optimizer> {
       std::string scope = scope_of(c);
       if (!comm) return nullptr;
       note = " (Dion3 momentum sharded by slice, " + scope + " selection)";
       return std::make_unique<Dion3Dist>(ps, dion3_config_from(c, "optim.dion3"), parse_select_scope(scope), comm);
     },
     "Dion3 then shards its momentum by slice across the ranks"});
}  // namespace

}  // namespace atl::parallel
