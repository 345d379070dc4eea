#include "parallel/expert_shards.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/kernels.h"
#include "optim/clip.h"

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
  model_ = &model;
  params_ = em->sharded_expert_parameters();
  ATOLL_CHECK(!params_.empty(), "expert shards: the model holds its experts unsharded (build it with expert_shard)");
  em->set_expert_dispatcher(dispatcher_.get());
}

ExpertShards::~ExpertShards() = default;

void ExpertShards::attach(const AdamWConfig& ac, int data_ranks, bool other_optimizer) {
  ATOLL_CHECK(!other_optimizer, "parallel.ep = {}: the sharded experts step with AdamW ([optim.adamw]) only in this "
              "build; remove the [optim] type / group keys", ep_size());
  std::vector<ParamRef> refs;
  for (nn::Parameter* q : params_) refs.push_back({q->name, q->value, q->grad, q->role});
  opt_ = std::make_unique<AdamW>(std::move(refs), ac);
  divisor_ = 1.f / float(std::max(1, data_ranks));
}

void ExpertShards::zero_grad() {
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
  for (nn::Parameter* q : params_) model_sd.emplace_back(a.to_file(q->name), gather(q->value));
  std::vector<std::pair<std::string, Tensor>> mine;
  opt_->save_state(mine, "");
  for (auto& [n, t] : mine)
    if (n != "step") opt_state.emplace_back(n, gather(t));  // the dense optimizer saves the shared step count
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
  TensorFile mine;
  const Tensor* step = opt_state.find("step");
  ATOLL_CHECK(step, "{}: no optimizer 'step' entry (the experts' AdamW state)", what);
  mine.tensors.emplace_back("step", *step);
  for (nn::Parameter* q : params_) {
    const std::string name = a.to_file(q->name);
    auto it = find_named(model_sd, name);
    ATOLL_CHECK(it != model_sd.end(), "{}: missing weight '{}'", what, name);
    take_slice(it->second, q->value, rank, ep_size(), name, what);
    model_sd.erase(it);
    for (const char* suf : {".exp_avg", ".exp_avg_sq"}) {
      const std::string n = q->name + suf;
      auto o = find_named(opt_state.tensors, n);
      ATOLL_CHECK(o != opt_state.tensors.end(), "{}: no AdamW state '{}' for the experts", what, n);
      Tensor t = Tensor::empty(q->shape);
      take_slice(o->second, t, rank, ep_size(), n, what);
      mine.tensors.emplace_back(n, t);
      opt_state.tensors.erase(o);
    }
  }
  opt_->load_state(mine, "");
}

int64_t ExpertShards::bytes() const {
  int64_t n = 0;
  for (nn::Parameter* q : params_) n += shape_numel(q->shape);
  return n * int64_t(sizeof(float)) * (opt_ ? 4 : 2);  // value, gradient (+ exp_avg, exp_avg_sq)
}

int64_t ExpertShards::full_bytes() const { return bytes() * ep_size(); }

}  // namespace atl::parallel
