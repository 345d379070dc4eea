// Dion3 (Ahn et al., "Dion3: Full-Stack Orthogonal Updates"; the update of optim/dion3.h) with its
// error-feedback momentum sharded by slice across data-parallel ranks, and a selection scope:
//
//  - each matrix's slices (rows or columns, per `select`) are cut into contiguous blocks of
//    ceil(#slices / world); rank r keeps the momentum M of block r only, stored slice-major;
//    gradients arrive already averaged (DDP), the per-slice second moment V (one float per slice)
//    and the parameters are replicated;
//  - scope "global": the L1 norms of every rank's slices are all-gathered and the top
//    ceil(alpha * #slices) are selected over the whole matrix, exactly as single-rank Dion3
//    (same tie-break), so the result equals it;
//  - scope "local": each rank selects the top ceil(alpha * #its slices) among its own slices, with
//    no norm exchange. This differs from single-rank Dion3 by design: every shard contributes the
//    same share of slices (a row-balanced selection), so a shard whose slices are all small still
//    gets updated; with alpha = 1 both scopes select everything and agree with single-rank Dion3.
// In both scopes the selected slices of every matrix are assembled with ONE all_reduce per step of a
// zero-filled buffer (each rank writes its own selected slices; adding zeros is exact), after
// which every rank orthogonalizes the k selected slices (k = alpha * #slices, so the redundant
// Newton-Schulz costs alpha^2..alpha of Muon's) and applies the identical update.
// State is saved as Dion3's (full momentum, variance); save_state is collective.
#pragma once
#include "comm/communicator.h"
#include "optim/dion3.h"
#include "parallel/optim/prmuon_sharded.h"

namespace atl::parallel {

enum class SelectScope { global, local };
SelectScope parse_select_scope(const std::string& s);

class Dion3Dist : public Optimizer {
 public:
  Dion3Dist(std::vector<ParamRef> params, Dion3Config cfg, SelectScope scope, comm::Communicator* comm);
  std::string name() const override { return "dion3"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;
  // The slices (global indices, ascending) selected for matrix i at the last step.
  const std::vector<int64_t>& last_selection(size_t i) const { return selected_[i]; }
  bool selects_rows(size_t i) const { return by_rows_[i]; }
  // This rank's block of slices of matrix i.
  RowBlock block(size_t i) const { return mine_[i]; }

 private:
  int64_t nslice(size_t i) const { return by_rows_[i] ? dims_[i].rows : dims_[i].cols; }
  int64_t len(size_t i) const { return by_rows_[i] ? dims_[i].cols : dims_[i].rows; }
  int64_t at(size_t i, int64_t s, int64_t j) const { return by_rows_[i] ? s * dims_[i].cols + j : j * dims_[i].cols + s; }

  std::vector<ParamRef> params_;
  std::vector<optim::MatDims> dims_;
  std::vector<bool> by_rows_;
  std::vector<RowBlock> mine_;
  std::vector<std::vector<float>> momentum_;  // [mine.size(), len], slice-major
  std::vector<Tensor> variance_;              // [#slices], replicated
  std::vector<std::vector<int64_t>> selected_;
  Dion3Config cfg_;
  SelectScope scope_;
  comm::Communicator* comm_;
  int rank_ = 0, world_ = 1;
};

}  // namespace atl::parallel
