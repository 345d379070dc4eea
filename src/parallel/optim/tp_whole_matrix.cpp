// Whole-matrix optimizers under tensor parallelism; see tp_whole_matrix.h.
#include "parallel/optim/tp_whole_matrix.h"

#include "optim/param_groups.h"
#include "parallel/optim/placement.h"

namespace atl::parallel {

Registry<TensorParallelPlacement>& tensor_parallel_placements() {
  static Registry<TensorParallelPlacement> r("tensor-parallel optimizer placement");
  return r;
}

TpWholeMatrix::TpWholeMatrix(std::vector<ParamRef> pieces, TensorParallel& tp,
                             const std::function<std::unique_ptr<Optimizer>(std::vector<ParamRef>)>& make)
    : pieces_(std::move(pieces)), tp_(tp) {
  std::vector<ParamRef> whole;
  for (size_t i = 0; i < pieces_.size(); ++i) {
    ParamRef w = pieces_[i];
    if (tp_.sharded(w.name)) {
      // (Not gathered yet: the trainer builds the optimizer before it initialises the weights.)
      split_.push_back(i);
      value_.push_back(Tensor::zeros(tp_.full_shape(w.name)));
      grad_.push_back(Tensor::zeros(tp_.full_shape(w.name)));
      w.value = value_.back();
      w.grad = grad_.back();
      tp_.keep_state_whole(w.name);
    }
    whole.push_back(std::move(w));
  }
  inner_ = make(std::move(whole));
}

void TpWholeMatrix::step(const StepContext& ctx) {
  // The weights are gathered every step, not kept: whatever wrote this rank's blocks since the
  // last step (a checkpoint load, an island's outer step) is what the whole matrix holds.
  for (size_t k = 0; k < split_.size(); ++k) {
    const ParamRef& p = pieces_[split_[k]];
    value_[k].copy_from(tp_.gather(p.name, p.value));
    grad_[k].copy_from(tp_.gather(p.name, p.grad));
  }
  inner_->step(ctx);
  for (size_t k = 0; k < split_.size(); ++k) {
    const ParamRef& p = pieces_[split_[k]];
    Tensor mine = tp_.take(p.name, value_[k]);
    Tensor dst = p.value;  // a view into the model's flat buffer
    dst.copy_from(mine);
  }
  steps_ = inner_->steps();
}

void TpWholeMatrix::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  inner_->save_state(out, prefix);
}

void TpWholeMatrix::load_state(const TensorFile& f, const std::string& prefix) {
  inner_->load_state(f, prefix);
  steps_ = inner_->steps();
}

TpOverride tensor_parallel_override(TensorParallel* tp) {
  if (!tp || tp->size() == 1) return {};
  return [tp](Config& cfg, const std::string& type, std::vector<ParamRef>& ps) -> std::unique_ptr<Optimizer> {
    if (!tensor_parallel_placements().has(type)) return nullptr;
    return tensor_parallel_placements().get(type).make(cfg, type, ps, *tp);
  };
}

namespace {
// Every whole-matrix (or whole-table) type of the optimizer registry steps whole tensors so.
TensorParallelPlacement whole_matrices() {
  return {[](Config& cfg, const std::string& type, std::vector<ParamRef>& ps, TensorParallel& tp) {
            return std::make_unique<TpWholeMatrix>(ps, tp, [&cfg, type](std::vector<ParamRef> whole) {
              return make_single_optimizer(cfg, type, std::move(whole));
            });
          },
          "split matrices gathered over tp and stepped whole on every tp rank"};
}
PlacementRegistrar<TensorParallelPlacement> muon(tensor_parallel_placements(), "muon", whole_matrices());
PlacementRegistrar<TensorParallelPlacement> prmuon(tensor_parallel_placements(), "prmuon", whole_matrices());
PlacementRegistrar<TensorParallelPlacement> dion3(tensor_parallel_placements(), "dion3", whole_matrices());
PlacementRegistrar<TensorParallelPlacement> soap(tensor_parallel_placements(), "soap", whole_matrices());
PlacementRegistrar<TensorParallelPlacement> ember(tensor_parallel_placements(), "ember", whole_matrices());
}  // namespace

}  // namespace atl::parallel
