#include "parallel/zero.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "autograd/graph.h"
#include "kernels/cpu/kernels.h"
#include "optim/clip.h"
#include "parallel/page_release.h"

namespace atl::parallel {

Zero::Zero(nn::Model& model, comm::Communicator* comm, int stage, int64_t bucket_elems, int hsdp_shard_size,
           const AdamWConfig& ac, const ShardedOptimizerFactory& make_opt, Mesh* mesh, const comm::CodecSpec& codec)
    : DataParallel(model, comm), stage_(stage), hsdp_(hsdp_shard_size > 0) {
  ATOLL_CHECK(stage >= 1 && stage <= 3, "ZeRO stage {} does not exist (1, 2 or 3)", stage);
  ATOLL_CHECK(hsdp_shard_size == 0 || stage == 3, "HSDP shards parameters: it needs stage 3");
  bool distributed = comm_ && comm_->size() > 1;
  if (distributed) {
    comm_->broadcast(model.flat_values(), 0);
    if (hsdp_shard_size > 0) {
      ATOLL_CHECK(comm_->size() % hsdp_shard_size == 0, "HSDP shard size {} does not divide {} ranks",
                  hsdp_shard_size, comm_->size());
      if (mesh) {
        // comm is one tp coordinate's data-parallel group (dp x cp): under tp x HSDP not the world.
        const MeshShape& m = mesh->shape();
        ATOLL_CHECK(m.dp_shard == hsdp_shard_size && m.dp() * m.cp == comm_->size(),
                    "HSDP shard size {} does not match the mesh {}", hsdp_shard_size, m.describe());
        // cp x HSDP: a replica is its dp_shard x cp ranks (cp ranks hold parts of one batch's
        // gradients, summed like the shards'); replicas average over dp_replicate.
        shard_ = m.cp > 1 ? mesh->group({"dp_shard", "cp"}) : mesh->axis("dp_shard");
        replica_ = mesh->axis("dp_replicate");
      } else {
        int r = comm_->rank();
        shard_owned_ = comm_->split(r / hsdp_shard_size, r);
        replica_owned_ = comm_->split(r % hsdp_shard_size, r);
        shard_ = shard_owned_.get();
        replica_ = replica_owned_.get();
      }
      if (replica_->size() == 1) replica_ = nullptr;
    } else {
      shard_ = comm_;
    }
  }
  setup_codec(codec);
  int S = shards(), sr = shard_ ? shard_->rank() : 0;
  // MPI's reduce-scatter and all-gather need separate buffers (MPI_IN_PLACE aside); Gloo's do not.
  in_place_rs_ = shard_ && shard_->backend() == "gloo";
  layout_ = stage == 3 ? unit_buckets(model, S, sr, block_bucket_, root_buckets_)
                       : size_buckets(model, bucket_elems, S, sr);
  st_.resize(layout_.buckets.size());
  for (size_t b = 0; b < st_.size(); ++b) {
    const BucketLayout& L = layout_.buckets[b];
    st_[b].pending = int(L.params.size());
  }
  tied_ = model.head_reads_lower_root();
  if (!block_bucket_.empty())
    for (int b : root_buckets_) (layout_.buckets[size_t(b)].range.lo == 0 ? bottom_ : top_) = b;
  if (stage == 3) {  // give back all but the own shards before the optimizer state is allocated
    release_all();
    zero_grad();
  }
  std::unique_ptr<ShardedOptimizer> o =
      make_opt ? make_opt(model, layout_, shard_) : std::make_unique<ShardedAdamW>(model, layout_, ac);
  sopt_ = o.get();
  opt_ = std::move(o);
  if (distributed)
    for (size_t i = 0; i < layout_.params.size(); ++i)
      add_grad_hook(layout_.params[i]->value, [this, i](const Tensor&) { on_grad_ready(int(i)); });
  if (stage == 3) model.set_block_hooks(this);
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

std::string Zero::name() const { return hsdp_ ? "hsdp" : "zero" + std::to_string(stage_); }

// ---------------------------------------------------------------- gradients

void Zero::on_grad_ready(int param) {
  if (!sync_) return;
  if (stage_ == 3) {
    reap_reduced();
    reap_gathered();
  }
  for (int b : layout_.buckets_of_param[size_t(param)]) {
    ATOLL_CHECK(!st_[size_t(b)].launched,
                "ZeRO: a second backward with gradient sync on before finish_backward(); turn sync off "
                "(set_sync(false)) on gradient-accumulation micro-steps");
    if (--st_[size_t(b)].pending == 0) launch_reduce(size_t(b));
  }
}

// A chunk buffer lives only while its collective is in flight; the caching allocator hands the
// same blocks out again next time, so nothing proportional to the model persists.
Tensor Zero::take_scratch(int64_t n) { return Tensor::empty({n}); }

void Zero::give_scratch(Tensor& t) { t = Tensor(); }

// Backpressure (as FSDP's rate limiter): a bucket's full-size gradients stay resident until its
// reduce-scatter completes, so when the communicator falls behind backward, wait for the oldest
// ones instead of letting the whole model's gradients pile up.
void Zero::throttle_reduces(size_t max_in_flight) {
  while (inflight_.size() > max_in_flight) {
    size_t b = inflight_.front();
    st_[b].reduce->wait();
    complete_reduce(b);
  }
}

// A finished reduce-scatter: this rank's sum goes into its own range of the gradient buffer (where
// an in-place reduce-scatter already wrote it) and the chunk back to the pool. Under stage 3 the
// bucket's other gradients are not needed any more, so they are given back during backward already.
void Zero::complete_reduce(size_t b) {
  BucketState& s = st_[b];
  if (!s.rs_out.defined()) return;
  const BucketLayout& L = layout_.buckets[b];
  float* g = model_.flat_grads().f32();
  if (stage_ == 3) {
    release_range(g, L.range.lo, L.own.lo);
    release_range(g, L.own.hi, L.range.hi);
    s.grads_released = true;
  }
  if (s.rs_out.f32() != g + L.own.lo)  // not reduced in place
    std::memcpy(g + L.own.lo, s.rs_out.f32(), size_t(L.own.size()) * sizeof(float));
  s.rs_out = Tensor();
  give_scratch(s.rs_buf);
  inflight_.erase(std::find(inflight_.begin(), inflight_.end(), b));
  s.rs_padded = Tensor();
  // The finished work still holds its tensors (the chunk among them): drop it, or every bucket's
  // chunk would stay allocated until finish_backward.
  s.reduce.reset();
}

void Zero::reap_reduced() {
  if (shards() == 1) return;
  for (size_t b = 0; b < st_.size(); ++b) {
    BucketState& s = st_[b];
    if (s.reduce && s.rs_out.defined() && s.reduce->done()) complete_reduce(b);
  }
}

// A gather that has finished gives its chunk buffer back now rather than when its unit is next
// used (a prefetch finishes long before): one chunk less next to the peak of backward.
void Zero::reap_gathered() {
  for (size_t b = 0; b < st_.size(); ++b)
    if (st_[b].gather && st_[b].gather->done()) finish_gather(b);
}

void Zero::set_before_reduce(BeforeReduce f) {
  ATOLL_CHECK(stage_ == 3, "ZeRO: a hook before each unit's reduction needs stage 3's units, not stage {}", stage_);
  for (const auto& bs : layout_.buckets_of_param)
    ATOLL_CHECK(bs.size() == 1, "ZeRO-3: a parameter spans {} units", bs.size());
  before_reduce_ = std::move(f);
}

void Zero::launch_reduce(size_t b) {
  const BucketLayout& L = layout_.buckets[b];
  BucketState& s = st_[b];
  s.launched = true;
  if (before_reduce_) {
    std::vector<nn::Parameter*> unit;
    for (int i : L.params) unit.push_back(layout_.params[size_t(i)]);
    before_reduce_(unit);
  }
  Tensor g = model_.flat_grads().slice(0, L.range.lo, L.range.hi);
  if (stage_ == 1) {
    if (!reduce_compressed(b, g)) s.reduce = shard_->all_reduce_async(g, comm::ReduceOp::sum);
    return;
  }
  if (shards() == 1) return;  // HSDP with one-rank groups: the own range is the bucket, already summed
  Tensor in = g;
  if (L.padded()) {
    s.rs_padded = Tensor::zeros({L.chunk * shards()});
    std::memcpy(s.rs_padded.f32(), g.f32(), size_t(g.numel()) * sizeof(float));
    in = s.rs_padded;
  }
  const int64_t r = shard_->rank();
  if (in_place_rs_) {
    s.rs_out = in.slice(0, r * L.chunk, (r + 1) * L.chunk);
  } else {
    s.rs_buf = take_scratch(L.chunk);
    s.rs_out = s.rs_buf;
  }
  inflight_.push_back(b);
  if (reduce_compressed(b, in)) return complete_reduce(b);
  s.reduce = shard_->reduce_scatter_async(in, s.rs_out, comm::ReduceOp::sum);
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
  for (size_t b = 0; b < st_.size(); ++b) {
    if (st_[b].reduce) st_[b].reduce->wait();
    complete_reduce(b);
  }
  for (auto& s : st_) {
    s.reduce.reset();
    s.grads_released = false;
  }
  if (replica_) {
    std::vector<comm::WorkPtr> ws;
    for (const BucketLayout& L : layout_.buckets)
      if (L.own.size() > 0)  // the same on every replica: they hold the same shard rank
        ws.push_back(replica_->all_reduce_async(G.slice(0, L.own.lo, L.own.hi), comm::ReduceOp::sum));
    for (auto& w : ws) w->wait();
  }
  for (size_t b = 0; b < st_.size(); ++b) {
    const BucketLayout& L = layout_.buckets[b];
    st_[b].launched = false;
    st_[b].pending = int(L.params.size());
    if (stage_ == 1) continue;
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

std::vector<std::pair<int64_t, int64_t>> Zero::reduced_grad_ranges() const {
  if (stage_ == 1 || shards() == 1) return {{0, model_.flat_grads().numel()}};
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const BucketLayout& L : layout_.buckets)
    if (L.own.size() > 0) out.push_back({L.own.lo, L.own.hi});
  return out;
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
  if (in_place_rs_ && !L.padded()) {  // Gloo gathers in place around this rank's own shard
    s.gather = shard_->all_gather_async(model_.flat_values().slice(0, L.own.lo, L.own.hi),
                                        model_.flat_values().slice(0, L.range.lo, L.range.hi));
    return;
  }
  s.ag_buf = take_scratch(L.chunk);
  Tensor chunk = s.ag_buf;
  std::memcpy(chunk.f32(), v + L.own.lo, size_t(L.own.size()) * sizeof(float));
  std::memset(chunk.f32() + L.own.size(), 0, size_t(L.chunk - L.own.size()) * sizeof(float));
  if (L.padded()) s.ag_padded = Tensor::empty({L.chunk * shards()});
  Tensor out = L.padded() ? s.ag_padded : model_.flat_values().slice(0, L.range.lo, L.range.hi);
  s.gather = shard_->all_gather_async(chunk, out);
}

void Zero::finish_gather(size_t b) {
  const BucketLayout& L = layout_.buckets[b];
  BucketState& s = st_[b];
  s.gather->wait();
  s.gather.reset();
  give_scratch(s.ag_buf);
  if (L.padded()) {
    std::memcpy(model_.flat_values().f32() + L.range.lo, s.ag_padded.f32(), size_t(L.range.size()) * sizeof(float));
    s.ag_padded = Tensor();
  }
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

// Gathers the buckets with at most two in flight, so at most two scratch chunks are live.
void Zero::gather_window(const std::vector<size_t>& bs) {
  std::vector<size_t> todo;
  for (size_t b : bs)
    if (!st_[b].gathered) todo.push_back(b);
  for (size_t k = 0; k < todo.size(); ++k) {
    if (k == 0 && !st_[todo[0]].gather) start_gather(todo[0]);
    if (k + 1 < todo.size() && !st_[todo[k + 1]].gather) start_gather(todo[k + 1]);
    finish_gather(todo[k]);
  }
}

void Zero::gather_all() {
  if (shards() == 1) return;
  std::vector<size_t> all(st_.size());
  for (size_t b = 0; b < all.size(); ++b) all[b] = b;
  gather_window(all);
}

void Zero::release_all() {
  for (size_t b = 0; b < st_.size(); ++b) release_values(b);
}

// The units that the head needs: final norm and untied head, or with a tied head the embeddings.
std::vector<size_t> Zero::top_units() const {
  std::vector<size_t> u;
  if (top_ >= 0) u.push_back(size_t(top_));
  if (tied_ && bottom_ >= 0) u.push_back(size_t(bottom_));
  return u;
}

void Zero::forward_begin() {
  if (shards() == 1) return;
  if (block_bucket_.empty()) {  // no blocks: the root is gathered from forward to the step
    std::vector<size_t> r(root_buckets_.begin(), root_buckets_.end());
    return gather_window(r);
  }
  if (bottom_ >= 0) {
    if (block_bucket_.size() > 0 && !st_[size_t(block_bucket_[0])].gathered && !st_[size_t(block_bucket_[0])].gather)
      start_gather(size_t(block_bucket_[0]));  // prefetch block 0 behind the embeddings
    ensure_gathered(size_t(bottom_));
  }
}

void Zero::before_forward(int64_t block) {
  if (shards() == 1) return;
  // The embedding lookup is done and its backward needs no weights: give them back unless the
  // tied head will use them.
  if (block == 0 && bottom_ >= 0 && !tied_) release_values(size_t(bottom_));
  ensure_gathered(size_t(block_bucket_[size_t(block)]));
  if (block + 1 < int64_t(block_bucket_.size())) {
    size_t nb = size_t(block_bucket_[size_t(block + 1)]);
    if (!st_[nb].gathered && !st_[nb].gather) start_gather(nb);  // prefetch
  } else {
    for (size_t u : top_units())
      if (!st_[u].gathered && !st_[u].gather) start_gather(u);  // prefetch the head
  }
}

void Zero::after_forward(int64_t block) {
  if (shards() == 1) return;
  release_values(size_t(block_bucket_[size_t(block)]));
  if (block + 1 == int64_t(block_bucket_.size()))
    for (size_t u : top_units()) ensure_gathered(u);
}

void Zero::before_backward(int64_t block) {
  if (shards() == 1) return;
  // The backward of the last block starts after the head's and the final norm's: release them.
  if (block + 1 == int64_t(block_bucket_.size()))
    for (size_t u : top_units()) release_values(u);
  ensure_gathered(size_t(block_bucket_[size_t(block)]));
  if (block > 0) {
    size_t pb = size_t(block_bucket_[size_t(block - 1)]);
    if (!st_[pb].gathered && !st_[pb].gather) start_gather(pb);  // prefetch
  }
}

void Zero::after_backward(int64_t block) {
  release_values(size_t(block_bucket_[size_t(block)]));
  if (shards() == 1 || !sync_) return;
  reap_reduced();
  throttle_reduces(2);
}

void Zero::step(const StepContext& ctx) {
  opt_->step(ctx);
  if (shards() == 1) return;
  if (stage_ == 3) {
    release_all();  // everything but the own shards is stale now
    return;
  }
  for (auto& s : st_) s.gathered = false;
  gather_all();
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
