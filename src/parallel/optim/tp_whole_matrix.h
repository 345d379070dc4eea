// Whole-matrix optimizers under tensor parallelism. Muon (Jordan et al., 2024), PRMuon, Dion3
// (Ahn et al., "Dion: Distributed Orthonormalized Updates", 2025), SOAP (Vyas et al., 2024) and
// Ember see a matrix or a table whole: Newton-Schulz and power iterations, Kronecker factors and
// their eigenbases, row and column statistics all run over every row and column, and Megatron's
// layout gives each tp rank a block of columns or rows (per fused part) of each linear and a
// range of the vocabulary's rows. Their tp form (TpWholeMatrix) gathers each split parameter's
// weight and gradient over the tp group (the same whole tensors on every tp rank, exactly: a
// gather moves bits), steps the one-rank optimizer over them (the same bits out on every rank:
// the same inputs through the same kernels) and keeps this rank's block of the result. So a
// tp-split matrix gets the update one rank gives it, whatever the optimizer does inside.
//
// The price: two all-gathers of each split matrix a step, and each tp rank holds the optimizer's
// whole state of its group (the state one rank holds) plus whole copies of weight and gradient.
// Parameters every tp rank holds whole (positions, norms) are stepped in place. The state is saved
// as one rank saves it (TensorParallel::keep_state_whole), so checkpoints move between layouts.
//
// Each optimizer type's tp form registers here by name, beside the data-parallel placements
// (placement.h); a type with no entry is refused under tp, naming its key (tensor_parallel.cpp).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/registry.h"
#include "optim/optimizer.h"
#include "parallel/tensor_parallel.h"

namespace atl::parallel {

struct TensorParallelPlacement {
  // The tp form of a group of `type` over this rank's pieces (their ParamRefs, local shapes).
  std::function<std::unique_ptr<Optimizer>(Config& cfg, const std::string& type, std::vector<ParamRef>& params,
                                           TensorParallel& tp)>
      make;
  std::string describe;  // for the log
};
Registry<TensorParallelPlacement>& tensor_parallel_placements();

class TpWholeMatrix final : public Optimizer {
 public:
  // make: the one-rank optimizer over the whole parameters it is given (same names, full shapes).
  TpWholeMatrix(std::vector<ParamRef> pieces, TensorParallel& tp,
                const std::function<std::unique_ptr<Optimizer>(std::vector<ParamRef>)>& make);
  std::string name() const override { return inner_->name(); }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;

 private:
  std::vector<ParamRef> pieces_;
  std::vector<size_t> split_;        // indices into pieces_ of the tp-split parameters
  std::vector<Tensor> value_, grad_;  // their whole weight and gradient, per split_ entry
  TensorParallel& tp_;
  std::unique_ptr<Optimizer> inner_;
};

// The override make_optimizer takes (optim/param_groups.h) under tp: each group whose type has a
// tp form gets it; element-wise types keep their one-rank form (a block of a matrix is stepped as
// one rank steps it). Null tp, or one rank: no override.
using TpOverride = std::function<std::unique_ptr<Optimizer>(Config& cfg, const std::string& type,
                                                            std::vector<ParamRef>& params)>;
TpOverride tensor_parallel_override(TensorParallel* tp);

}  // namespace atl::parallel
