#include "parallel/expert_shards.h"

#include <cmath>
#include <map>
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "optim/clip.h"
#include "parallel/pipeline.h"

namespace atl::parallel {

ExpertShards::ExpertShards(nn::Model& model, std::unique_ptr<nn::ExpertDispatcher> dispatcher, comm::Communicator* ep,
                           std::unique_ptr<comm::Communicator> replicas)
    : model_(&model), dispatcher_(std::move(dispatcher)), ep_(ep), replicas_(std::move(replicas)) {
  rebind(model);
}

void ExpertShards::rebind(nn::Model& model) {
  ATOLL_CHECK(!opt_, "expert shards: rebind() after attach()");
  auto* em = dynamic_cast<nn::ExpertModel*>(&model);
  ATOLL_CHECK(em, "expert shards: model family '{}' has no experts", model.family());
  ATOLL_CHECK(!pp_, "expert shards: rebind() after set_pipeline()");
  model_ = &model;
  params_ = em->sharded_expert_parameters();
  all_ = params_;
  ATOLL_CHECK(!params_.empty(), "expert shards: the model holds its experts unsharded (build it with expert_shard)");
  em->set_expert_dispatcher(dispatcher_.get());
}

ExpertShards::~ExpertShards() = default;

void ExpertShards::set_pipeline(const PipelineParallel& pipe, comm::Communicator* pp) {
  ATOLL_CHECK(!opt_, "expert shards: set_pipeline() after attach()");
  ATOLL_CHECK(pp && pp->size() == pipe.stages() && pp->rank() == pipe.stage_rank(),
              "expert shards: the pp group ({} ranks) does not match the pipeline's {} stages", pp ? pp->size() : 1,
              pipe.stages());
  // Each expert tensor belongs to the block whose name prefixes it, that block to its virtual stage.
  const std::vector<nn::Module*> blocks = model_->blocks();
  const auto& stage_blocks = pipe.stage_blocks();
  owner_.clear();
  params_.clear();
  for (nn::Parameter* q : all_) {
    int owner = -1;
    for (size_t b = 0; b < blocks.size() && owner < 0; ++b) {
      const std::string prefix = blocks[b]->name() + ".";
      if (q->name.compare(0, prefix.size(), prefix) != 0) continue;
      for (size_t s = 0; s < stage_blocks.size(); ++s)
        if (int64_t(b) >= stage_blocks[s].first && int64_t(b) < stage_blocks[s].second) owner = int(s) % pipe.stages();
    }
    ATOLL_CHECK(owner >= 0, "expert shards: no pipeline stage holds the block of '{}'", q->name);
    owner_.push_back(owner);
    if (owner == pp->rank()) params_.push_back(q);
  }
  pp_ = pp;
  others_bound_ = true;  // until released: the whole model's experts were built and initialised here
  release_others();
}

void ExpertShards::release_others() {
  if (!others_bound_) return;
  for (size_t i = 0; i < all_.size(); ++i)
    if (!mine(i)) all_[i]->value = Tensor(), all_[i]->grad = Tensor();
  others_bound_ = false;
}

void ExpertShards::sync_full_model() {
  if (!pp_) return;
  std::vector<comm::WorkPtr> ws;
  for (size_t i = 0; i < all_.size(); ++i) {
    nn::Parameter* q = all_[i];
    if (!mine(i) && !q->value.defined()) q->value = Tensor::empty(q->shape);
    ws.push_back(pp_->broadcast_async(q->value, owner_[i]));
  }
  for (auto& w : ws) w->wait();
  others_bound_ = true;
}

void ExpertShards::attach(const AdamWConfig& ac, int data_ranks, bool other_optimizer) {
  ATOLL_CHECK(!other_optimizer, "parallel.ep = {}: the sharded experts step with AdamW ([optim.adamw]) only in this "
              "build; remove the [optim] type / group keys", ep_size());
  std::vector<ParamRef> refs;
  for (nn::Parameter* q : params_) refs.push_back({q->name, q->value, q->grad, q->role});
  opt_ = std::make_unique<AdamW>(std::move(refs), ac);
  divisor_ = 1.f / float(std::max(1, data_ranks));
}

void ExpertShards::zero_grad() {
  release_others();  // an evaluation's copies of the other stages' experts
  for (nn::Parameter* q : params_) q->grad.zero();
}

void ExpertShards::finish_backward() {
  if (replicas_ && replicas_->size() > 1) {
    std::vector<comm::WorkPtr> w;
    for (nn::Parameter* q : params_) w.push_back(replicas_->all_reduce_async(q->grad, comm::ReduceOp::sum));
    for (auto& x : w) x->wait();
  }
  for (nn::Parameter* q : params_) cpu::scale_inplace(q->grad.f32(), divisor_, q->grad.numel());
}

double ExpertShards::grad_norm(double dense_norm) {
  double sq = 0;
  for (nn::Parameter* q : params_) {
    const double n = atl::grad_norm(q->grad);
    sq += n * n;
  }
  if (ep_ && ep_->size() > 1) {  // a double as two floats (high part and remainder): ~1e-14
    Tensor t = Tensor::empty({2});
    t.f32()[0] = float(sq);
    t.f32()[1] = float(sq - double(t.f32()[0]));
    ep_->all_reduce(t, comm::ReduceOp::sum);
    sq = double(t.f32()[0]) + double(t.f32()[1]);
  }
  if (pp_ && pp_->size() > 1) {  // every stage's experts (each stage's summed over its ep group above)
    Tensor t = Tensor::empty({2});
    t.f32()[0] = float(sq);
    t.f32()[1] = float(sq - double(t.f32()[0]));
    pp_->all_reduce(t, comm::ReduceOp::sum);
    sq = double(t.f32()[0]) + double(t.f32()[1]);
  }
  return std::sqrt(dense_norm * dense_norm + sq);
}

void ExpertShards::step(const StepContext& ctx) {
  ATOLL_CHECK(opt_, "expert shards: step() before attach()");
  opt_->step(ctx);
}

Tensor ExpertShards::gather(const Tensor& local) const {
  Shape s = local.shape();
  const int64_t P = ep_size();
  s[0] *= P;
  Tensor full = Tensor::empty(s);
  if (P > 1) ep_->all_gather(local.contiguous(), full.view({shape_numel(s)}));
  else full.copy_from(local);
  return full;
}

void ExpertShards::full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                              std::vector<std::pair<std::string, Tensor>>& opt_state) {
  const nn::StateDictAdapter& a = model_->state_dict_adapter();
  std::vector<std::pair<std::string, Tensor>> state;
  opt_->save_state(state, "");
  std::map<std::string, Tensor> moments(state.begin(), state.end());
  // Under a pipeline each tensor comes from its stage first (every stage's ranks of this ep
  // coordinate take it), then from the ep group; without one from the ep group only.
  auto from_stage = [&](size_t i, Tensor t) {
    if (!mine(i)) t = Tensor::empty(all_[i]->shape);
    if (pp_ && pp_->size() > 1) pp_->broadcast(t, owner_[i]);
    return t;
  };
  for (size_t i = 0; i < all_.size(); ++i)
    model_sd.emplace_back(a.to_file(all_[i]->name), gather(from_stage(i, all_[i]->value)));
  // The dense optimizer saves the shared step count; AdamW's two moments per expert tensor here.
  for (size_t i = 0; i < all_.size(); ++i)
    for (const char* suf : {".exp_avg", ".exp_avg_sq"}) {
      const std::string n = all_[i]->name + suf;
      Tensor t;
      if (mine(i)) {
        auto it = moments.find(n);
        ATOLL_CHECK(it != moments.end(), "expert shards: the experts' AdamW has no '{}'", n);
        t = it->second;
      }
      opt_state.emplace_back(n, gather(from_stage(i, t)));
    }
}

namespace {
// Rows [rank * L, (rank + 1) * L) of a whole-model tensor [E, ...] into `dst` [L, ...].
void take_slice(const Tensor& full, Tensor& dst, int64_t rank, int64_t ranks, const std::string& name,
                const std::string& what) {
  Shape want = dst.shape();
  want[0] *= ranks;
  ATOLL_CHECK(full.shape() == want,
              "{}: '{}' has shape {}, the model's experts are {} ({} per expert-parallel rank)", what, name,
              shape_str(full.shape()), shape_str(want), shape_str(dst.shape()));
  const int64_t per = dst.numel();
  std::memcpy(dst.f32(), full.contiguous().f32() + rank * per, size_t(per) * sizeof(float));
}

template <typename V>
typename V::iterator find_named(V& v, const std::string& n) {
  for (auto it = v.begin(); it != v.end(); ++it)
    if (it->first == n) return it;
  return v.end();
}
}  // namespace

void ExpertShards::local_state(std::vector<std::pair<std::string, Tensor>>& model_sd, TensorFile& opt_state,
                               const std::string& what) {
  ATOLL_CHECK(opt_, "expert shards: local_state() before attach()");
  const nn::StateDictAdapter& a = model_->state_dict_adapter();
  const int64_t rank = ep_ ? ep_->rank() : 0;
  TensorFile own;
  const Tensor* step = opt_state.find("step");
  ATOLL_CHECK(step, "{}: no optimizer 'step' entry (the experts' AdamW state)", what);
  own.tensors.emplace_back("step", *step);
  for (size_t i = 0; i < all_.size(); ++i) {
    nn::Parameter* q = all_[i];
    const std::string name = a.to_file(q->name);
    auto it = find_named(model_sd, name);
    ATOLL_CHECK(it != model_sd.end(), "{}: missing weight '{}'", what, name);
    // Another stage's experts (pp x ep) are only checked and taken out of what the dense model loads.
    Tensor slot = mine(i) ? q->value : Tensor::empty(q->shape);
    take_slice(it->second, slot, rank, ep_size(), name, what);
    model_sd.erase(it);
    for (const char* suf : {".exp_avg", ".exp_avg_sq"}) {
      const std::string n = q->name + suf;
      auto o = find_named(opt_state.tensors, n);
      ATOLL_CHECK(o != opt_state.tensors.end(), "{}: no AdamW state '{}' for the experts", what, n);
      Tensor t = Tensor::empty(q->shape);
      take_slice(o->second, t, rank, ep_size(), n, what);
      if (mine(i)) own.tensors.emplace_back(n, t);
      opt_state.tensors.erase(o);
    }
  }
  opt_->load_state(own, "");
}

int64_t ExpertShards::bytes() const {
  int64_t n = 0;
  for (nn::Parameter* q : params_) n += shape_numel(q->shape);
  return n * int64_t(sizeof(float)) * (opt_ ? 4 : 2);  // value, gradient (+ exp_avg, exp_avg_sq)
}

int64_t ExpertShards::full_bytes() const { return bytes() * ep_size(); }

}  // namespace atl::parallel
