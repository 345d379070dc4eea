// The Muon family on ZeRO's flat shards; see sharded_muon.h.
#include "parallel/optim/sharded_muon.h"
#include "parallel/optim/placement.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "optim/optim_util.h"
#include "optim/param_groups.h"
#include "parallel/optim/muon_owner.h"

namespace atl::parallel {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

ShardedMuon::ShardedMuon(nn::Model& model, const FlatLayout& layout, comm::Communicator* group, ShardedMuonConfig cfg,
                         const TensorParallel* tp)
    : model_(model), group_(group), tp_(tp && tp->size() > 1 ? tp : nullptr), cfg_(std::move(cfg)) {
  ATOLL_CHECK(cfg_.type == "muon" || cfg_.type == "prmuon",
              "ZeRO shards the Muon family as type \"muon\" or \"prmuon\", not '{}'", cfg_.type);
  ATOLL_CHECK(cfg_.prm.period >= 1, "prmuon: period K must be at least 1, got {}", cfg_.prm.period);
  rank_ = group_ ? group_->rank() : 0;
  world_ = group_ ? group_->size() : 1;
  const auto& mc = cfg_.prm.muon;
  std::vector<bool> hidden(layout.params.size(), false);
  std::vector<int> mat_of(layout.params.size(), -1);
  std::vector<double> cost;
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const nn::Parameter* p = layout.params[i];
    if (classify_param(ParamRef{p->name, p->value, Tensor(), p->role}) != ParamClass::hidden) continue;
    hidden[i] = true;
    Mat m;
    m.param = int(i);
    m.lo = layout.spans[i].lo;
    m.rows = p->shape[0];
    m.cols = p->value.numel() / m.rows;
    m.full_rows = m.rows;
    m.full_cols = m.cols;
    if (tp_ && tp_->sharded(p->name)) {
      const Shape f = tp_->full_shape(p->name);
      m.split = true;
      m.full_rows = f[0];
      m.full_cols = shape_numel(f) / f[0];
      // Rows normalized and columns cut by tp, or the other way round: a slice is in pieces.
      m.cross = cfg_.prm.normalize_rows ? m.full_cols != m.cols : m.full_rows != m.rows;
    }
    m.scale = optim::update_scale(mc.scale, m.full_rows, m.full_cols, mc.layout);
    m.slice0 = nslices_;
    nslices_ += cfg_.prm.normalize_rows ? m.rows : m.cols;
    m.state0 = hidden_numel_;
    hidden_numel_ += m.rows * m.cols;
    mat_of[i] = int(mats_.size());
    mats_.push_back(m);
    // The whole matrix's cost: the same on every tp rank, so they choose the same owners.
    cost.push_back(optim::ns_flops(m.full_rows, m.full_cols, mc.ns));
  }
  std::vector<int> own = assign_owners_lpt(cost, world_);
  for (size_t k = 0; k < mats_.size(); ++k) {
    mats_[k].owner = own[k];
    if (own[k] == rank_) max_owned_ = std::max(max_owned_, mats_[k].rows * mats_[k].cols);
  }

  // Every rank's pieces, from the buckets' equal chunks (each rank derives all of them alike).
  std::vector<std::vector<Piece>> all(static_cast<size_t>(world_));
  for (const BucketLayout& b : layout.buckets) {
    ATOLL_CHECK(b.shards == world_, "ZeRO layout has {} shards but the sharding group has {} ranks", b.shards, world_);
    for (int r = 0; r < world_; ++r) {
      Span own_r{std::min(b.range.hi, b.range.lo + r * b.chunk), std::min(b.range.hi, b.range.lo + (r + 1) * b.chunk)};
      for (int i : b.params) {
        if (!hidden[size_t(i)]) continue;
        const Span& ps = layout.spans[size_t(i)];
        Span s{std::max(ps.lo, own_r.lo), std::min(ps.hi, own_r.hi)};
        if (s.size() > 0) all[size_t(r)].push_back({size_t(mat_of[size_t(i)]), s});
      }
    }
  }
  // Within the holder->owner chunk, pieces go in matrix order, then flat order: holder and owner
  // both compute the same offsets without exchanging anything.
  std::vector<int64_t> covered(mats_.size(), 0);
  for (int r = 0; r < world_; ++r) {
    auto& ps = all[size_t(r)];
    std::sort(ps.begin(), ps.end(), [](const Piece& a, const Piece& b) {
      return a.mat != b.mat ? a.mat < b.mat : a.flat.lo < b.flat.lo;
    });
    std::vector<int64_t> vol(size_t(world_), 0);
    int64_t state = 0;
    for (Piece& p : ps) {
      int o = mats_[p.mat].owner;
      p.a2a = vol[size_t(o)];
      vol[size_t(o)] += p.flat.size();
      p.state = state;
      state += p.flat.size();
      covered[p.mat] += p.flat.size();
      if (o == rank_) incoming_.emplace_back(r, p);
    }
    for (int64_t v : vol) chunk_ = std::max(chunk_, v);
  }
  for (size_t k = 0; k < mats_.size(); ++k)
    ATOLL_CHECK(covered[k] == mats_[k].rows * mats_[k].cols, "ZeRO shards cover {} of the {} elements of {}",
                covered[k], mats_[k].rows * mats_[k].cols, layout.params[size_t(mats_[k].param)]->name);
  std::stable_sort(incoming_.begin(), incoming_.end(),
                   [](const auto& a, const auto& b) { return a.second.mat < b.second.mat; });
  mine_ = all[size_t(rank_)];
  fit_.assign(mats_.size(), 1.f);
  momentum_.assign(mine_.empty() ? 0 : size_t(mine_.back().state + mine_.back().flat.size()), 0.f);
  rest_ = std::make_unique<ShardedAdamW>(model, layout, cfg_.adamw, [hidden](int i) { return !hidden[size_t(i)]; },
                                         "adamw.");
}

double ShardedMuon::padding_fraction() const {
  double cap = double(chunk_) * double(world_) * double(world_);  // every rank's send buffer
  return cap > 0 ? (cap - double(hidden_numel_)) / cap : 0.0;
}

std::vector<int> ShardedMuon::owners() const {
  std::vector<int> o;
  for (const Mat& m : mats_) o.push_back(m.owner);
  return o;
}

bool ShardedMuon::refresh_step() const {
  return cfg_.type == "muon" || (mat_steps_ - 1) % cfg_.prm.period == 0;
}

void ShardedMuon::orthogonalize_by_owners(std::vector<float>& u) {
  const int64_t total = int64_t(world_) * chunk_;
  Tensor send = Tensor::zeros({total});
  for (const Piece& p : mine_)
    std::memcpy(send.f32() + mats_[p.mat].owner * chunk_ + p.a2a, u.data() + p.state,
                size_t(p.flat.size()) * sizeof(float));
  Tensor recv = send;
  double t0 = now_s();
  if (world_ > 1) {
    recv = Tensor::empty({total});
    group_->all_to_all(send, recv);
  }
  double t1 = now_s();
  timing_.exchange_s += t1 - t0;
  // The owner: assemble, orthogonalize, and put each holder's pieces of the result where the
  // holder's pieces came from (send is free again; the return exchange mirrors the first).
  std::vector<float> full(static_cast<size_t>(max_owned_)), orth;
  if (fitted()) orth.resize(full.size());  // the fit needs the momentum and its orthogonalization
  std::vector<float> fit(mats_.size(), 0.f);
  const auto& ns = cfg_.prm.muon.ns;
  for (size_t a = 0; a < incoming_.size();) {
    size_t k = incoming_[a].second.mat, b = a;
    const Mat& m = mats_[k];
    for (; b < incoming_.size() && incoming_[b].second.mat == k; ++b) {
      const auto& [r, p] = incoming_[b];
      std::memcpy(full.data() + (p.flat.lo - m.lo), recv.f32() + r * chunk_ + p.a2a,
                  size_t(p.flat.size()) * sizeof(float));
    }
    float* o = fitted() ? orth.data() : full.data();
    if (m.split) {
      orthogonalize_whole(k, full.data(), o, fitted() ? &fit[k] : nullptr);
    } else {
      optim::orthogonalize(full.data(), o, m.rows, m.cols, ns);
      if (fitted())  // exactly the single-rank computation: the owner holds both whole matrices
        fit[k] = optim::row_fit(
            optim::row_fit_parts(o, full.data(), m.rows, m.cols, cfg_.prm.normalize_rows, cfg_.prm.eps));
    }
    for (size_t c = a; c < b; ++c) {
      const auto& [r, p] = incoming_[c];
      std::memcpy(send.f32() + r * chunk_ + p.a2a, o + (p.flat.lo - m.lo), size_t(p.flat.size()) * sizeof(float));
    }
    a = b;
  }
  recv = Tensor();  // the incoming pieces are consumed: keep at most two exchange buffers alive
  if (fitted()) {
    // Every rank learns every matrix's fitted scale: only its owner's entry is non-zero, so the sum is exact.
    Tensor t = Tensor::empty({std::max<int64_t>(int64_t(fit.size()), 1)});
    std::copy(fit.begin(), fit.end(), t.f32());
    if (world_ > 1 && !fit.empty()) group_->all_reduce(t, comm::ReduceOp::sum);
    for (size_t k = 0; k < mats_.size(); ++k) fit_[k] = t.f32()[k];
  }
  Tensor back = send;
  double t2 = now_s();
  timing_.orthogonalize_s += t2 - t1;
  if (world_ > 1) {
    back = Tensor::empty({total});
    group_->all_to_all(send, back);
  }
  timing_.exchange_s += now_s() - t2;
  for (const Piece& p : mine_)
    std::memcpy(u.data() + p.state, back.f32() + mats_[p.mat].owner * chunk_ + p.a2a,
                size_t(p.flat.size()) * sizeof(float));
}

void ShardedMuon::orthogonalize_whole(size_t k, const float* u, float* o, float* fit) {
  // Every owner of this dp coordinate's tp group reaches here for the same matrices in the same
  // order (owners chosen from whole costs, incoming_ in matrix order): the gathers pair up.
  const Mat& m = mats_[k];
  const nn::Parameter* p = model_.parameters()[size_t(m.param)];
  Tensor block = Tensor::empty(p->shape);
  std::memcpy(block.f32(), u, size_t(m.rows * m.cols) * sizeof(float));
  Tensor whole = tp_->gather(p->name, block).contiguous();  // the one-rank Nesterov update, bit for bit
  Tensor orth = fit ? Tensor::empty(whole.shape()) : whole;
  optim::orthogonalize(whole.f32(), orth.f32(), m.full_rows, m.full_cols, cfg_.prm.muon.ns);
  if (fit)
    *fit = optim::row_fit(optim::row_fit_parts(orth.f32(), whole.f32(), m.full_rows, m.full_cols,
                                               cfg_.prm.normalize_rows, cfg_.prm.eps));
  Tensor mine = tp_->take(p->name, orth).contiguous();
  std::memcpy(o, mine.f32(), size_t(m.rows * m.cols) * sizeof(float));
}

// Visits the row segments [e, end) of a piece (element indices relative to the matrix) with their row.
template <class F>
static void for_row_segments(int64_t lo, int64_t hi, int64_t cols, F&& f) {
  for (int64_t e = lo; e < hi;) {
    int64_t row = e / cols, end = std::min(hi, (row + 1) * cols);
    f(row, e, end);
    e = end;
  }
}

void ShardedMuon::normalize_slices_sharded(std::vector<float>& u) {
  const bool rows = cfg_.prm.normalize_rows;
  std::vector<double> acc(size_t(nslices_), 0.0);
  for (const Piece& p : mine_) {
    const Mat& m = mats_[p.mat];
    const int64_t off = p.flat.lo - m.lo;  // x[j - off] is element j of the matrix
    const float* x = u.data() + p.state;
    double* s = acc.data() + m.slice0;
    for_row_segments(off, p.flat.hi - m.lo, m.cols, [&](int64_t row, int64_t e, int64_t end) {
      if (rows) {
        double t = 0;
        for (int64_t j = e; j < end; ++j) t += double(x[j - off]) * x[j - off];
        s[row] += t;
      } else {
        for (int64_t j = e; j < end; ++j) s[j - row * m.cols] += double(x[j - off]) * x[j - off];
      }
    });
  }
  // A slice cut by a shard boundary has partial sums on several ranks. They travel as the bits of
  // the doubles (one all_gather) and every rank adds them in rank order: the norm is then the
  // single-rank one up to double rounding, where a float all_reduce would perturb the update's
  // last bit.
  std::vector<double> tot = acc;
  if (world_ > 1 && nslices_ > 0) {
    Tensor mine = Tensor::empty({nslices_}, DType::i64), all = Tensor::empty({world_ * nslices_}, DType::i64);
    std::memcpy(mine.data<int64_t>(), acc.data(), acc.size() * sizeof(double));
    group_->all_gather(mine, all);
    const double* parts = reinterpret_cast<const double*>(all.data<int64_t>());
    for (int64_t i = 0; i < nslices_; ++i) {
      double t = 0;
      for (int r = 0; r < world_; ++r) t += parts[int64_t(r) * nslices_ + i];
      tot[size_t(i)] = t;
    }
  }
  if (tp_) add_cut_slices_over_tp(tot);
  // The same factor as optim::normalize_slices: gain / (||slice|| + eps), in float.
  std::vector<float> fac(static_cast<size_t>(nslices_));
  for (const Mat& m : mats_) {
    const int64_t len = rows ? m.rows : m.cols;
    const double whole_len = double(rows ? m.full_rows : m.full_cols);
    const float gain = fitted() ? fit_[size_t(&m - mats_.data())]
                                : float(std::sqrt(double(std::min(m.full_rows, m.full_cols)) / whole_len));
    for (int64_t i = m.slice0; i < m.slice0 + len; ++i)
      fac[size_t(i)] = gain / (float(std::sqrt(tot[size_t(i)])) + cfg_.prm.eps);
  }
  for (const Piece& p : mine_) {
    const Mat& m = mats_[p.mat];
    const int64_t off = p.flat.lo - m.lo;
    float* x = u.data() + p.state;
    const float* f = fac.data() + m.slice0;
    for_row_segments(off, p.flat.hi - m.lo, m.cols, [&](int64_t row, int64_t e, int64_t end) {
      if (rows) {
        for (int64_t j = e; j < end; ++j) x[j - off] *= f[row];
      } else {
        for (int64_t j = e; j < end; ++j) x[j - off] *= f[j - row * m.cols];
      }
    });
  }
}

void ShardedMuon::add_cut_slices_over_tp(std::vector<double>& tot) {
  // A slice that runs across tp's split has one partial sum on each tp rank. The tp ranks have the
  // same such slices (their count is the whole matrix's), so they exchange the doubles' bits and
  // add them in tp rank order, as the shard group does; slices along the split are whole here.
  int64_t n = 0;
  for (const Mat& m : mats_)
    if (m.cross) n += cfg_.prm.normalize_rows ? m.rows : m.cols;
  if (n == 0) return;
  const int T = tp_->size();
  Tensor mine = Tensor::empty({n}, DType::i64), all = Tensor::empty({T * n}, DType::i64);
  double* w = reinterpret_cast<double*>(mine.data<int64_t>());
  for (const Mat& m : mats_)
    if (m.cross)
      for (int64_t i = 0, len = cfg_.prm.normalize_rows ? m.rows : m.cols; i < len; ++i) *w++ = tot[size_t(m.slice0 + i)];
  tp_->comm()->all_gather(mine, all);
  const double* parts = reinterpret_cast<const double*>(all.data<int64_t>());
  int64_t j = 0;
  for (const Mat& m : mats_)
    if (m.cross)
      for (int64_t i = 0, len = cfg_.prm.normalize_rows ? m.rows : m.cols; i < len; ++i, ++j) {
        double t = 0;
        for (int q = 0; q < T; ++q) t += parts[int64_t(q) * n + j];
        tot[size_t(m.slice0 + i)] = t;
      }
}

void ShardedMuon::step(const StepContext& ctx) {
  const double t0 = now_s();
  ++steps_;
  ++mat_steps_;
  rest_->step(ctx);
  timing_.adamw_s += now_s() - t0;
  const auto& mc = cfg_.prm.muon;
  const float lr = mc.lr * ctx.lr_scale;
  const float* G = model_.flat_grads().f32();
  float* W = model_.flat_values().f32();
  std::vector<float> u(momentum_.size());
  for (const Piece& p : mine_)
    optim::muon_momentum(momentum_.data() + p.state, G + p.flat.lo, u.data() + p.state, p.flat.size(), mc.momentum,
                         mc.nesterov, ctx.grad_scale);
  if (refresh_step()) orthogonalize_by_owners(u);
  else normalize_slices_sharded(u);
  for (const Piece& p : mine_)
    optim::apply_scaled_update(W + p.flat.lo, u.data() + p.state, p.flat.size(), lr, mats_[p.mat].scale,
                               mc.weight_decay);
  timing_.total_s += now_s() - t0;
  ++timing_.steps;
}

// ---------------------------------------------------------------- checkpoints

void ShardedMuon::save_full_state(std::vector<std::pair<std::string, Tensor>>& out, comm::Communicator* group) const {
  out.emplace_back("step", optim::step_tensor(steps_));
  rest_->save_full_state(out, group);
  const std::string pre = cfg_.type + ".";
  out.emplace_back(pre + "step", optim::step_tensor(mat_steps_));
  // Pieces are disjoint and zero elsewhere: a sum over the group assembles the full momenta.
  Tensor full = Tensor::zeros({std::max<int64_t>(hidden_numel_, 1)});
  for (const Piece& p : mine_) {
    const Mat& m = mats_[p.mat];
    std::memcpy(full.f32() + m.state0 + (p.flat.lo - m.lo), momentum_.data() + p.state,
                size_t(p.flat.size()) * sizeof(float));
  }
  if (group && group->size() > 1) group->all_reduce(full, comm::ReduceOp::sum);
  const auto& params = model_.parameters();
  for (const Mat& m : mats_) {
    const nn::Parameter* p = params[size_t(m.param)];
    out.emplace_back(pre + p->name + ".momentum", full.slice(0, m.state0, m.state0 + m.rows * m.cols).view(p->shape));
  }
  if (fitted())  // replicated on every rank, as single-rank PeriodicRowMuon saves it
    for (size_t k = 0; k < mats_.size(); ++k) {
      Tensor c = Tensor::full({1}, fit_[k]);
      out.emplace_back(pre + params[size_t(mats_[k].param)]->name + ".row_fit", c);
    }
}

void ShardedMuon::load_full_state(const TensorFile& f) {
  steps_ = optim::read_step(f, "step");
  rest_->load_full_state(f);
  const std::string pre = cfg_.type + ".";
  mat_steps_ = optim::read_step(f, pre + "step");
  const auto& params = model_.parameters();
  for (const Piece& p : mine_) {
    const Mat& m = mats_[p.mat];
    const nn::Parameter* par = params[size_t(m.param)];
    const std::string key = pre + par->name + ".momentum";
    ATOLL_CHECK(f.find(key), "optimizer state has no {} (was it saved by another optimizer than {}?)", key, cfg_.type);
    Tensor t = f.get(key).contiguous();
    ATOLL_CHECK(t.numel() == m.rows * m.cols && t.dtype() == DType::f32,
                "optimizer state {} has {} elements, the parameter {}",
                key, t.numel(), m.rows * m.cols);
    std::memcpy(momentum_.data() + p.state, t.f32() + (p.flat.lo - m.lo), size_t(p.flat.size()) * sizeof(float));
  }
  if (fitted())
    for (size_t k = 0; k < mats_.size(); ++k) {
      Tensor c = Tensor::empty({1});
      optim::load_checked(c, f, pre + params[size_t(mats_[k].param)]->name + ".row_fit");
      fit_[k] = c.f32()[0];
    }
}

void ShardedMuon::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  std::vector<std::pair<std::string, Tensor>> mine;
  save_full_state(mine, group_);
  for (auto& [n, t] : mine) out.emplace_back(prefix + n, t);
}

void ShardedMuon::load_state(const TensorFile& f, const std::string& prefix) {
  TensorFile stripped;
  for (auto& [n, t] : f.tensors)
    if (n.compare(0, prefix.size(), prefix) == 0) stripped.tensors.emplace_back(n.substr(prefix.size()), t);
  load_full_state(stripped);
}

namespace {
ShardedOptimizerFactory sharded_muon_factory(Config& c, const AdamWConfig& adamw, const std::string& type,
                                             const TensorParallel* tp) {
  ShardedMuonConfig smc;
  smc.type = type;
  if (type == "prmuon") smc.prm = prmuon_config_from(c, "optim.prmuon");
  else smc.prm.muon = muon_config_from(c, "optim.muon");
  smc.adamw = adamw;
  return [smc, tp](nn::Model& m, const FlatLayout& l, comm::Communicator* g) {
    return std::unique_ptr<ShardedOptimizer>(std::make_unique<ShardedMuon>(m, l, g, smc, tp));
  };
}
const char* kOwners = " (Muon matrices orthogonalized by their owner ranks)";
PlacementRegistrar<ShardedPlacement> muon(
    sharded_placements(), "muon",
    {[](Config& c, const AdamWConfig& a, const TensorParallel* tp) { return sharded_muon_factory(c, a, "muon", tp); },
     kOwners});
PlacementRegistrar<ShardedPlacement> prmuon(
    sharded_placements(), "prmuon",
    {[](Config& c, const AdamWConfig& a, const TensorParallel* tp) { return sharded_muon_factory(c, a, "prmuon", tp); },
     kOwners});
}  // namespace

}  // namespace atl::parallel
