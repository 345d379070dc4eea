#include "parallel/optim/sharded_adamw.h"

#include "parallel/optim/placement.h"
#include <algorithm>
#include <cstring>
#include <map>

#include "optim/optim_util.h"

namespace atl::parallel {

namespace {
const char* kSuffixes[] = {".exp_avg", ".exp_avg_sq"};
}

ShardedAdamW::ShardedAdamW(nn::Model& model, const FlatLayout& layout, const AdamWConfig& cfg,
                           const std::function<bool(int param)>& take, std::string prefix)
    : layout_(layout), taken_(layout.params.size(), true), prefix_(std::move(prefix)) {
  if (take)
    for (size_t i = 0; i < taken_.size(); ++i) taken_[i] = take(int(i));
  std::vector<ParamRef> refs;
  const Tensor& V = model.flat_values();
  const Tensor& G = model.flat_grads();
  for (const BucketLayout& b : layout.buckets) {
    if (b.own.size() <= 0) continue;
    for (int i : b.params) {
      if (!taken_[size_t(i)]) continue;
      const Span& ps = layout.spans[size_t(i)];
      Span s{std::max(ps.lo, b.own.lo), std::min(ps.hi, b.own.hi)};
      if (s.size() <= 0) continue;
      const nn::Parameter* p = layout.params[size_t(i)];
      std::string name = p->name + "@" + std::to_string(s.lo - ps.lo);
      Shape shape = p->shape.size() >= 2 ? Shape{1, s.size()} : Shape{s.size()};
      refs.push_back({name, V.slice(0, s.lo, s.hi).view(shape), G.slice(0, s.lo, s.hi).view(shape)});
      pieces_.push_back({i, s, name});
    }
  }
  inner_ = std::make_unique<AdamW>(std::move(refs), cfg);
}

void ShardedAdamW::save_full_state(std::vector<std::pair<std::string, Tensor>>& out, comm::Communicator* group) const {
  std::vector<std::pair<std::string, Tensor>> mine;
  inner_->save_state(mine, "");
  std::map<std::string, const Tensor*> by;
  for (auto& [n, t] : mine) by[n] = &t;
  // Every rank of the group holds the same step count.
  out.emplace_back(prefix_ + "step", optim::step_tensor(inner_->steps()));
  for (const char* suf : kSuffixes) {
    Tensor full = Tensor::zeros({layout_.numel});
    for (const Piece& pc : pieces_) {
      const Tensor& t = *by.at(pc.name + suf);
      std::memcpy(full.f32() + pc.span.lo, t.f32(), size_t(pc.span.size()) * sizeof(float));
    }
    // Shards are disjoint and zero elsewhere: a sum assembles them.
    if (group && group->size() > 1) group->all_reduce(full, comm::ReduceOp::sum);
    for (size_t i = 0; i < layout_.params.size(); ++i) {
      if (!taken_[i]) continue;
      const Span& s = layout_.spans[i];
      out.emplace_back(prefix_ + layout_.params[i]->name + suf, full.slice(0, s.lo, s.hi).view(layout_.params[i]->shape));
    }
  }
}

void ShardedAdamW::load_full_state(const TensorFile& f) {
  TensorFile mine;
  mine.tensors.emplace_back("step", f.get(prefix_ + "step"));
  for (const Piece& pc : pieces_) {
    const nn::Parameter* p = layout_.params[size_t(pc.param)];
    const Span& ps = layout_.spans[size_t(pc.param)];
    for (const char* suf : kSuffixes) {
      const Tensor& full = f.get(prefix_ + p->name + suf);
      ATOLL_CHECK(full.numel() == ps.size(), "optimizer state {}{}{} has {} elements, the parameter {}", prefix_, p->name,
                  suf, full.numel(), ps.size());
      Tensor piece = full.contiguous().reshape({full.numel()}).slice(0, pc.span.lo - ps.lo, pc.span.hi - ps.lo);
      Shape shape = p->shape.size() >= 2 ? Shape{1, pc.span.size()} : Shape{pc.span.size()};
      mine.tensors.emplace_back(pc.name + suf, piece.contiguous().view(shape));
    }
  }
  inner_->load_state(mine, "");
  steps_ = inner_->steps();
}

namespace {
PlacementRegistrar<ShardedPlacement> reg(
    sharded_placements(), "adamw",
    {[](Config&, const AdamWConfig& a, const TensorParallel*) -> ShardedOptimizerFactory {  // element-wise
       return [a](nn::Model& m, const FlatLayout& l, comm::Communicator*) {
         return std::unique_ptr<ShardedOptimizer>(std::make_unique<ShardedAdamW>(m, l, a));
       };
     },
     ""});
}  // namespace

}  // namespace atl::parallel
