// SCAPE; see scape.h.
#include "parallel/scape.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/log.h"
#include "optim/clip.h"
#include "optim/optim_util.h"
#include "optim/param_groups.h"

namespace atl::parallel {

// AdamS over the flat buffers, updating only the coordinates of the current mask.
class ScapeAdamS final : public Optimizer {
 public:
  ScapeAdamS(nn::Model& model, const AdamSConfig& cfg) : model_(model), cfg_(cfg) {
    const Tensor& V = model.flat_values();
    m_ = Tensor::zeros({V.numel()});
    decayed_.assign(size_t(V.numel()), 0);
    for (const ParamRef& p : model.param_refs()) {
      int64_t lo = p.value.f32() - V.f32();
      spans_.push_back({p.name, lo, p.value.shape()});
      if (p.value.dim() >= 2) std::fill(decayed_.begin() + lo, decayed_.begin() + lo + p.value.numel(), 1);
    }
  }
  std::string name() const override { return "adams"; }
  // mask null: every coordinate.
  void set_mask(const std::vector<int32_t>* mask) { mask_ = mask; }
  void step(const StepContext& ctx) override {
    ++steps_;
    const float lr = cfg_.lr * ctx.lr_scale, b1 = cfg_.beta1, b2 = cfg_.beta2, eps = cfg_.eps, gs = ctx.grad_scale;
    const float decay = 1.f - lr * cfg_.weight_decay;
    float* w = model_.flat_values().f32();
    float* m = m_.f32();
    const float* g = model_.flat_grads().f32();
    const uint8_t* dec = decayed_.data();
    // The same expression as AdamS::step, so that a dense step equals it bitwise.
    auto update = [&](int64_t j) {
      float gj = gs * g[j];
      float v = b2 * m[j] * m[j] + (1.f - b2) * gj * gj;
      float mj = b1 * m[j] + (1.f - b1) * gj;
      m[j] = mj;
      w[j] = w[j] * (dec[j] ? decay : 1.f) - lr * mj / (std::sqrt(v) + eps);
    };
    const int64_t n = m_.numel();
    if (!mask_) {
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t j = 0; j < n; ++j) update(j);
      return;
    }
    if (decay != 1.f) {  // weight decay everywhere, the masked coordinates' share undone below
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t j = 0; j < n; ++j)
        if (dec[j]) w[j] *= decay;
    }
    const int32_t* idx = mask_->data();
    const int64_t k = int64_t(mask_->size());
#pragma omp parallel for schedule(static) if (k > 65536)
    for (int64_t t = 0; t < k; ++t) {
      int64_t j = idx[t];
      if (dec[j]) w[j] /= decay;  // decayed once, in update()
      update(j);
    }
  }
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override {
    // The names DDP with [optim] type = "adams" saves (a GroupedOptimizer with one AdamS group),
    // so checkpoints move between the two strategies.
    out.emplace_back(prefix + "step", optim::step_tensor(steps_));
    out.emplace_back(prefix + "adams.step", optim::step_tensor(steps_));
    for (const Span& s : spans_)
      out.emplace_back(prefix + "adams." + s.name + ".exp_avg",
                       m_.slice(0, s.lo, s.lo + shape_numel(s.shape)).view(s.shape));
  }
  void load_state(const TensorFile& f, const std::string& prefix) override {
    steps_ = optim::read_step(f, prefix + "adams.step");
    for (const Span& s : spans_) {
      Tensor dst = m_.slice(0, s.lo, s.lo + shape_numel(s.shape)).view(s.shape);
      optim::load_checked(dst, f, prefix + "adams." + s.name + ".exp_avg");
    }
  }
  const Tensor& exp_avg() const { return m_; }
  const AdamSConfig& config() const { return cfg_; }

 private:
  struct Span {
    std::string name;
    int64_t lo;
    Shape shape;
  };
  nn::Model& model_;
  AdamSConfig cfg_;
  Tensor m_;
  std::vector<uint8_t> decayed_;
  std::vector<Span> spans_;
  const std::vector<int32_t>* mask_ = nullptr;
};

Scape::Scape(nn::Model& model, comm::Communicator* comm, const AdamSConfig& cfg, double sparsity, bool lazy)
    : DataParallel(model, comm), sparsity_(sparsity), lazy_(lazy) {
  opt_ = std::make_unique<ScapeAdamS>(model, cfg);
  n_ = model.flat_values().numel();
  ATOLL_CHECK(n_ < (int64_t(1) << 31), "parallel.strategy = 'scape': {} parameters exceed int32 mask indices", n_);
  const int W = world();
  shard_ = (n_ + W - 1) / W;
  kmax_ = std::max<int64_t>(sparsity_ > 0 ? 1 : 0, int64_t(std::ceil((1.0 - sparsity_) * double(shard_))));
  bitmap_ = (shard_ + 31) / 32 < kmax_;
  words_ = bitmap_ ? (shard_ + 31) / 32 : kmax_;
  residual_.assign(size_t(n_), 0.f);
  if (comm_ && W > 1) comm_->broadcast(model.flat_values(), 0);
}

Scape::~Scape() {
  if (stats_.steps > 0 && world() > 1)
    log::info("scape {:.4g}: {} value bytes and {} index bytes sent by this rank in {} steps, {:.4f} of DDP's f32 "
              "({} bytes)", sparsity_, stats_.value_bytes, stats_.index_bytes, stats_.steps, stats_.ratio(),
              stats_.dense_bytes);
  if (pending_) try {
      pending_->wait();
    } catch (...) {
    }
}

ScapeAdamS* Scape::opt() { return static_cast<ScapeAdamS*>(opt_.get()); }

int64_t Scape::mask_size() const { return dense_ ? n_ : int64_t(mask_.size()); }

void Scape::zero_grad() { model_.zero_grad(); }

void Scape::take_gathered_mask() {
  if (!pending_) return;
  pending_->wait();
  pending_.reset();
  mask_.clear();
  const int W = world();
  for (int r = 0; r < W; ++r) {  // shards are disjoint and in order: the union stays sorted
    const int32_t* p = gathered_.i32() + int64_t(r) * words_;
    const int64_t lo = r * shard_, hi = std::min(n_, lo + shard_);
    if (bitmap_) {
      for (int64_t i = 0; i < hi - lo; ++i)
        if (uint32_t(p[i / 32]) >> (i % 32) & 1u) mask_.push_back(int32_t(lo + i));
    } else {
      for (int64_t i = 0; i < words_ && p[i] >= 0; ++i) mask_.push_back(p[i]);
    }
  }
  dense_ = false;
}

void Scape::finish_backward() {
  const float d = take_grad_divisor();
  float* g = model_.flat_grads().f32();
  float* e = residual_.data();
  take_gathered_mask();
  const int W = world();
  const int64_t k = mask_size();
  Tensor vals = Tensor::empty({std::max<int64_t>(k, 1)});
  float* v = vals.f32();
  if (dense_) {
    for (int64_t j = 0; j < n_; ++j) {
      v[j] = e[j] + g[j];
      e[j] = 0.f;
    }
  } else {
    for (int64_t j = 0; j < n_; ++j) e[j] += g[j];
    for (int64_t t = 0; t < k; ++t) {
      int32_t j = mask_[size_t(t)];
      v[t] = e[j];
      e[j] = 0.f;
    }
  }
  if (comm_ && W > 1 && k > 0) comm_->all_reduce(vals.slice(0, 0, k), comm::ReduceOp::sum);
  if (d != 1.f)
    for (int64_t t = 0; t < k; ++t) v[t] *= d;
  if (dense_) {
    std::memcpy(g, v, size_t(n_) * 4);
  } else {
    std::memset(g, 0, size_t(n_) * 4);
    for (int64_t t = 0; t < k; ++t) g[mask_[size_t(t)]] = v[t];
  }
  ++stats_.steps;
  stats_.value_bytes += 2 * int64_t(W - 1) * k * 4 / W;
  stats_.dense_bytes += 2 * int64_t(W - 1) * n_ * 4 / W;
}

double Scape::grad_norm() { return atl::grad_norm(model_.flat_grads()); }

void Scape::step(const StepContext& ctx) {
  opt()->set_mask(dense_ || !lazy_ ? nullptr : &mask_);
  opt_->step(ctx);
  if (sparsity_ > 0) make_next_mask();
}

void Scape::make_next_mask() {
  // This rank's shard of the flat parameters: the top kmax coordinates by |b1 m + (1 - b1) e|.
  const int W = world(), me = rank();
  const int64_t lo = std::min(n_, me * shard_), hi = std::min(n_, lo + shard_);
  const float b1 = opt()->config().beta1;
  const float* m = opt()->exp_avg().f32();
  std::vector<float> stat(size_t(hi - lo));
  for (int64_t j = lo; j < hi; ++j) stat[size_t(j - lo)] = std::fabs(b1 * m[j] + (1.f - b1) * residual_[size_t(j)]);
  std::vector<int32_t> idx(size_t(hi - lo));
  for (int64_t j = lo; j < hi; ++j) idx[size_t(j - lo)] = int32_t(j);
  const int64_t k = std::min<int64_t>(kmax_, hi - lo);
  if (k < hi - lo)
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
      float sa = stat[size_t(a - lo)], sb = stat[size_t(b - lo)];
      return sa > sb || (sa == sb && a < b);
    });
  idx.resize(size_t(k));
  std::sort(idx.begin(), idx.end());
  mine_ = Tensor::zeros({std::max<int64_t>(words_, 1)}, DType::i32);
  int32_t* p = mine_.i32();
  if (bitmap_) {
    for (int32_t j : idx) p[(j - lo) / 32] = int32_t(uint32_t(p[(j - lo) / 32]) | (1u << ((j - lo) % 32)));
  } else {
    std::fill(p, p + words_, -1);
    std::copy(idx.begin(), idx.end(), p);
  }
  gathered_ = Tensor::zeros({int64_t(W) * std::max<int64_t>(words_, 1)}, DType::i32);
  if (comm_ && W > 1) {
    pending_ = comm_->all_gather_async(mine_, gathered_);  // overlaps the next forward and backward
    stats_.index_bytes += int64_t(W - 1) * words_ * 4;
  } else {
    std::memcpy(gathered_.i32(), p, size_t(words_) * 4);
    pending_ = nullptr;
    // One rank: the mask is ready at once (take it now, as a finished gather would be).
    mask_.assign(idx.begin(), idx.end());
    dense_ = false;
  }
}

// Besides the model and AdamS: what a bit-exact resume needs. The next step's mask (its gather
// completed now, which changes no value: the next step would wait for it first) with whether the
// next exchange is still the dense first one, and every rank's unsent gradient (the error
// feedback), all-gathered for the writer as scape.residual.rank<r>.
void Scape::full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                       std::vector<std::pair<std::string, Tensor>>& opt_state) {
  model_sd = model_.state_dict();
  opt_->save_state(opt_state, "");
  take_gathered_mask();
  const int W = world();
  Tensor meta = Tensor::empty({3}, DType::i64);
  int64_t* mt = meta.data<int64_t>();
  mt[0] = dense_ ? 1 : 0;
  mt[1] = W;
  mt[2] = int64_t(mask_.size());
  opt_state.emplace_back("scape.state", meta);
  std::vector<int32_t> mask = mask_;
  if (mask.empty()) mask.push_back(-1);  // no zero-size tensors in a checkpoint
  opt_state.emplace_back("scape.mask", Tensor::from_vector_i32(mask, {int64_t(mask.size())}));
  Tensor mine = Tensor::from_vector(residual_, {n_});
  if (!comm_ || W == 1) {
    opt_state.emplace_back("scape.residual.rank0", mine);
    return;
  }
  Tensor all = Tensor::empty({int64_t(W) * n_});
  comm_->all_gather(mine, all);
  for (int r = 0; r < W; ++r)
    opt_state.emplace_back(fmt::format("scape.residual.rank{}", r), all.slice(0, r * n_, (r + 1) * n_).clone());
}

void Scape::load_full_state(const std::vector<std::pair<std::string, Tensor>>& model_sd, const TensorFile& opt_state,
                            const std::string& what) {
  model_.load_state_dict(model_sd, what);
  opt_->load_state(opt_state, "");
  if (pending_) pending_->wait();
  pending_.reset();
  std::fill(residual_.begin(), residual_.end(), 0.f);
  mask_.clear();
  dense_ = true;
  const Tensor* meta = opt_state.find("scape.state");
  if (!meta) {  // saved by another strategy: nothing unsent, the first exchange dense
    log::info("scape: {} holds no SCAPE state; the first exchange is dense and the error feedback starts at zero",
              what);
    return;
  }
  ATOLL_CHECK(meta->dtype() == DType::i64 && meta->numel() == 3, "{}: scape.state is not an i64 [3]", what);
  const int64_t* mt = meta->contiguous().data<int64_t>();
  const int64_t saved_w = mt[1], k = mt[2];
  dense_ = mt[0] != 0;
  const Tensor& m = opt_state.get("scape.mask");
  ATOLL_CHECK(m.dtype() == DType::i32 && m.numel() >= k, "{}: scape.mask holds {} indices, scape.state says {}", what,
              m.numel(), k);
  const int32_t* mi = m.contiguous().i32();
  for (int64_t t = 0; t < k; ++t) {
    ATOLL_CHECK(mi[t] >= 0 && mi[t] < n_ && (t == 0 || mi[t] > mi[t - 1]),
                "{}: scape.mask[{}] = {} is not a sorted index below {}", what, t, mi[t], n_);
    mask_.push_back(mi[t]);
  }
  auto residual_of = [&](int64_t r) {
    const Tensor& e = opt_state.get(fmt::format("scape.residual.rank{}", r));
    ATOLL_CHECK(e.numel() == n_, "{}: scape.residual.rank{} has {} values, the model {}", what, r, e.numel(), n_);
    return e.contiguous().to_vector();
  };
  if (saved_w == world()) {
    residual_ = residual_of(rank());
    return;
  }
  // Another world size: the exchange sums the ranks' residuals, so rank 0 carries their sum
  // and the others none (the total unsent gradient is kept; its split over ranks is not).
  log::info("scape: {} was saved by {} ranks, this job has {}: rank 0 takes the summed error feedback", what, saved_w,
            world());
  if (rank() != 0) return;
  std::vector<double> sum(size_t(n_), 0.0);
  for (int64_t r = 0; r < saved_w; ++r) {
    std::vector<float> e = residual_of(r);
    for (int64_t j = 0; j < n_; ++j) sum[size_t(j)] += e[size_t(j)];
  }
  for (int64_t j = 0; j < n_; ++j) residual_[size_t(j)] = float(sum[size_t(j)]);
}

namespace {
struct Register {
  Register() {
    strategy_registry().add(
        "scape", {false, [](nn::Model& model, comm::Communicator* comm, const ParallelConfig& pc, const AdamWConfig&,
                            std::unique_ptr<Optimizer> opt, const ShardedOptimizerFactory&,
                            Mesh*) -> std::unique_ptr<DataParallel> {
                    // AdamS's settings come from the optimizer the config built ([optim.adams]).
                    const AdamS* a = nullptr;
                    if (auto* g = dynamic_cast<GroupedOptimizer*>(opt.get()); g && g->groups().size() == 1)
                      a = dynamic_cast<const AdamS*>(g->groups()[0].opt.get());
                    if (!a) a = dynamic_cast<const AdamS*>(opt.get());
                    ATOLL_CHECK(a, "parallel.strategy = 'scape' runs AdamS on every parameter: set [optim] type = "
                                "'adams' (and no optim.embed/head/vector overrides); got '{}'",
                                opt ? opt->name() : "adamw");
                    return std::make_unique<Scape>(model, comm, a->config(), pc.scape_sparsity, pc.scape_lazy);
                  }});
  }
} reg;
}  // namespace

}  // namespace atl::parallel
