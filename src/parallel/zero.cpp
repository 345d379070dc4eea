#include "parallel/zero.h"

#include <cmath>
#include <cstring>

#include "autograd/graph.h"
#include "kernels/cpu/kernels.h"
#include "optim/clip.h"
#include "parallel/page_release.h"

namespace atl::parallel {

Zero::Zero(nn::GPT& model, comm::Communicator* comm, int stage, int64_t bucket_elems, int hsdp_shard_size,
           const AdamWConfig& ac)
    : DataParallel(model, comm), stage_(stage) {
  ATOLL_CHECK(stage >= 1 && stage <= 3, "ZeRO stage {} does not exist (1, 2 or 3)", stage);
  ATOLL_CHECK(hsdp_shard_size == 0 || stage == 3, "HSDP shards parameters: it needs stage 3");
  bool distributed = comm_ && comm_->size() > 1;
  if (distributed) {
    comm_->broadcast(model.flat_values(), 0);
    if (hsdp_shard_size > 0) {
      ATOLL_CHECK(comm_->size() % hsdp_shard_size == 0, "HSDP shard size {} does not divide {} ranks",
                  hsdp_shard_size, comm_->size());
      int r = comm_->rank();
      shard_owned_ = comm_->split(r / hsdp_shard_size, r);
      replica_ = comm_->split(r % hsdp_shard_size, r);
      shard_ = shard_owned_.get();
      if (replica_->size() == 1) replica_.reset();
    } else {
      shard_ = comm_;
    }
  }
  int S = shards(), sr = shard_ ? shard_->rank() : 0;
  layout_ = stage == 3 ? unit_buckets(model, S, sr, block_bucket_, root_buckets_)
                       : size_buckets(model, bucket_elems, S, sr);
  st_.resize(layout_.buckets.size());
  for (size_t b = 0; b < st_.size(); ++b) {
    const BucketLayout& L = layout_.buckets[b];
    st_[b].pending = int(L.params.size());
    if (stage >= 2 || S > 1) st_[b].chunk = Tensor::zeros({L.chunk});
    if (L.padded()) st_[b].padded = Tensor::zeros({L.chunk * S});
  }
  auto o = std::make_unique<ShardedAdamW>(model, layout_, ac);
  sopt_ = o.get();
  opt_ = std::move(o);
  if (distributed)
    for (size_t i = 0; i < layout_.params.size(); ++i)
      add_grad_hook(layout_.params[i]->value, [this, i](const Tensor&) { on_grad_ready(int(i)); });
  if (stage == 3) {
    model.set_block_hooks(this);
    release_all();
  }
}

Zero::~Zero() {
  if (stage_ == 3) model_.set_block_hooks(nullptr);
  for (nn::Parameter* p : layout_.params) clear_grad_hooks(p->value);
  for (auto& s : st_)
    for (auto* w : {&s.reduce, &s.gather})
      if (*w) try {
          (*w)->wait();
        } catch (...) {
        }
}

std::string Zero::name() const { return shard_owned_ ? "hsdp" : "zero" + std::to_string(stage_); }

// ---------------------------------------------------------------- gradients

void Zero::on_grad_ready(int param) {
  if (!sync_) return;
  if (stage_ == 3) reap_reduced();
  for (int b : layout_.buckets_of_param[size_t(param)]) {
    ATOLL_CHECK(!st_[size_t(b)].launched,
                "ZeRO: a second backward with gradient sync on before finish_backward(); turn sync off "
                "(set_sync(false)) on gradient-accumulation micro-steps");
    if (--st_[size_t(b)].pending == 0) launch_reduce(size_t(b));
  }
}

// Stage 3: once a bucket's reduce-scatter has finished, its full-size gradients are not needed any
// more (this rank's sum is in the chunk), so they are given back during backward already.
void Zero::reap_reduced() {
  if (shards() == 1) return;
  for (size_t b = 0; b < st_.size(); ++b) {
    BucketState& s = st_[b];
    if (s.reduce && !s.grads_released && s.reduce->done()) {
      const BucketLayout& L = layout_.buckets[b];
      release_range(model_.flat_grads().f32(), L.range.lo, L.range.hi);
      s.grads_released = true;
    }
  }
}

void Zero::launch_reduce(size_t b) {
  const BucketLayout& L = layout_.buckets[b];
  BucketState& s = st_[b];
  s.launched = true;
  Tensor g = model_.flat_grads().slice(0, L.range.lo, L.range.hi);
  if (stage_ == 1) {
    s.reduce = shard_->all_reduce_async(g, comm::ReduceOp::sum);
    return;
  }
  if (shards() == 1) {  // HSDP with one-rank groups: nothing to scatter
    std::memcpy(s.chunk.f32(), g.f32(), size_t(L.chunk) * sizeof(float));
    return;
  }
  Tensor in = g;
  if (L.padded()) {
    std::memcpy(s.padded.f32(), g.f32(), size_t(g.numel()) * sizeof(float));
    std::memset(s.padded.f32() + g.numel(), 0, size_t(s.padded.numel() - g.numel()) * sizeof(float));
    in = s.padded;
  }
  s.reduce = shard_->reduce_scatter_async(in, s.chunk, comm::ReduceOp::sum);
}

void Zero::finish_backward() {
  float d = take_grad_divisor();
  const Tensor& G = model_.flat_grads();
  if (!comm_ || comm_->size() == 1) {
    if (d != 1.f) cpu::scale_inplace(G.f32(), d, G.numel());
    return;
  }
  for (size_t b = 0; b < st_.size(); ++b)
    if (!st_[b].launched) launch_reduce(b);
  for (auto& s : st_) {
    if (s.reduce) s.reduce->wait();
  }
  if (stage_ == 3) reap_reduced();
  for (auto& s : st_) {
    s.reduce.reset();
    s.grads_released = false;
  }
  if (replica_) {
    std::vector<comm::WorkPtr> ws;
    for (auto& s : st_) ws.push_back(replica_->all_reduce_async(s.chunk, comm::ReduceOp::sum));
    for (auto& w : ws) w->wait();
  }
  for (size_t b = 0; b < st_.size(); ++b) {
    const BucketLayout& L = layout_.buckets[b];
    st_[b].launched = false;
    st_[b].pending = int(L.params.size());
    if (stage_ == 1) continue;
    std::memcpy(G.f32() + L.own.lo, st_[b].chunk.f32(), size_t(L.own.size()) * sizeof(float));
    cpu::scale_inplace(G.f32() + L.own.lo, d, L.own.size());
  }
  if (stage_ == 1) cpu::scale_inplace(G.f32(), d, G.numel());
}

double Zero::grad_norm() {
  const Tensor& G = model_.flat_grads();
  if (stage_ == 1 || shards() == 1) return atl::grad_norm(G);
  double ss = 0;
  for (const BucketLayout& L : layout_.buckets) ss += cpu::sum_squares(G.f32() + L.own.lo, L.own.size());
  Tensor t = Tensor::empty({2});
  t.f32()[0] = float(ss);
  t.f32()[1] = float(ss - double(t.f32()[0]));
  shard_->all_reduce(t, comm::ReduceOp::sum);
  return std::sqrt(double(t.f32()[0]) + double(t.f32()[1]));
}

void Zero::zero_grad() {
  if (stage_ < 3 || shards() == 1) return model_.zero_grad();
  // Only the own shards hold anything (reap_reduced gave the rest back); zero them and make sure.
  float* g = model_.flat_grads().f32();
  for (const BucketLayout& L : layout_.buckets) {
    std::memset(g + L.own.lo, 0, size_t(L.own.size()) * sizeof(float));
    release_range(g, L.range.lo, L.own.lo);
    release_range(g, L.own.hi, L.range.hi);
  }
}

// ---------------------------------------------------------------- parameters

void Zero::start_gather(size_t b) {
  const BucketLayout& L = layout_.buckets[b];
  BucketState& s = st_[b];
  const float* v = model_.flat_values().f32();
  std::memcpy(s.chunk.f32(), v + L.own.lo, size_t(L.own.size()) * sizeof(float));
  std::memset(s.chunk.f32() + L.own.size(), 0, size_t(L.chunk - L.own.size()) * sizeof(float));
  Tensor out = L.padded() ? s.padded : model_.flat_values().slice(0, L.range.lo, L.range.hi);
  s.gather = shard_->all_gather_async(s.chunk, out);
}

void Zero::finish_gather(size_t b) {
  const BucketLayout& L = layout_.buckets[b];
  BucketState& s = st_[b];
  s.gather->wait();
  s.gather.reset();
  if (L.padded())
    std::memcpy(model_.flat_values().f32() + L.range.lo, s.padded.f32(), size_t(L.range.size()) * sizeof(float));
  s.gathered = true;
}

void Zero::ensure_gathered(size_t b) {
  if (st_[b].gathered) return;
  if (!st_[b].gather) start_gather(b);
  finish_gather(b);
}

void Zero::release_values(size_t b) {
  if (shards() == 1) return;
  if (st_[b].gather) finish_gather(b);
  const BucketLayout& L = layout_.buckets[b];
  float* v = model_.flat_values().f32();
  release_range(v, L.range.lo, L.own.lo);
  release_range(v, L.own.hi, L.range.hi);
  st_[b].gathered = false;
}

void Zero::gather_all() {
  if (shards() == 1) return;
  for (size_t b = 0; b < st_.size(); ++b)
    if (!st_[b].gathered && !st_[b].gather) start_gather(b);
  for (size_t b = 0; b < st_.size(); ++b)
    if (!st_[b].gathered) finish_gather(b);
}

void Zero::release_all() {
  for (size_t b = 0; b < st_.size(); ++b) release_values(b);
}

void Zero::forward_begin() {
  if (shards() == 1) return;
  for (int b : root_buckets_)
    if (!st_[size_t(b)].gathered && !st_[size_t(b)].gather) start_gather(size_t(b));
  for (int b : root_buckets_) ensure_gathered(size_t(b));
}

void Zero::before_forward(int64_t block) {
  if (shards() == 1) return;
  ensure_gathered(size_t(block_bucket_[size_t(block)]));
  if (block + 1 < int64_t(block_bucket_.size())) {
    size_t nb = size_t(block_bucket_[size_t(block + 1)]);
    if (!st_[nb].gathered && !st_[nb].gather) start_gather(nb);  // prefetch
  }
}

void Zero::after_forward(int64_t block) { release_values(size_t(block_bucket_[size_t(block)])); }

void Zero::before_backward(int64_t block) {
  if (shards() == 1) return;
  ensure_gathered(size_t(block_bucket_[size_t(block)]));
  if (block > 0) {
    size_t pb = size_t(block_bucket_[size_t(block - 1)]);
    if (!st_[pb].gathered && !st_[pb].gather) start_gather(pb);  // prefetch
  }
}

void Zero::after_backward(int64_t block) { release_values(size_t(block_bucket_[size_t(block)])); }

void Zero::step(const StepContext& ctx) {
  opt_->step(ctx);
  if (shards() == 1) return;
  if (stage_ == 3) {
    release_all();  // everything but the own shards is stale now
    return;
  }
  for (size_t b = 0; b < st_.size(); ++b) start_gather(b);
  for (size_t b = 0; b < st_.size(); ++b) finish_gather(b);
}

// ---------------------------------------------------------------- checkpoints

void Zero::full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                      std::vector<std::pair<std::string, Tensor>>& opt_state) {
  if (stage_ == 3) {
    gather_all();
    for (auto& [n, t] : model_.state_dict()) model_sd.emplace_back(n, t.clone());
    release_all();
  } else {
    model_sd = model_.state_dict();
  }
  sopt_->save_full_state(opt_state, shard_);
}

void Zero::load_full_state(const std::vector<std::pair<std::string, Tensor>>& model_sd, const TensorFile& opt_state,
                           const std::string& what) {
  for (size_t b = 0; b < st_.size(); ++b)
    if (st_[b].gather) finish_gather(b);
  model_.load_state_dict(model_sd, what);
  for (auto& s : st_) s.gathered = true;
  if (stage_ == 3) release_all();
  sopt_->load_full_state(opt_state);
}

}  // namespace atl::parallel
