// Periodic Row-wise Muon ("Scaling Muon for Diffusion Transformers"): the full Newton-Schulz update
// of Muon once every K steps (steps 1, K+1, 2K+1, ...), and on the other steps a row-wise
// normalized update from the current momentum, U_i / ||U_i||. Row normalization is elementwise per
// row, so on a row-sharded momentum it needs no communication; only refresh steps gather matrices.
//
// The row-normalized update is rescaled by sqrt(min(m, n) / m) (per row axis; n for columns) so
// that its Frobenius norm equals that of the orthogonal update it stands in for, and both then take
// Muon's update scale. axis = "rows" normalizes storage rows (contiguous, the sharding-friendly
// choice), "cols" normalizes columns.
#pragma once
#include "optim/muon.h"

namespace atl {

struct PeriodicRowMuonConfig {
  MuonConfig muon;
  int period = 4;           // K
  bool normalize_rows = true;  // false: columns
  float eps = 1e-8f;
};

namespace optim {
// u[rows, cols] <- each row (or column) divided by its norm + eps, times `gain`.
void normalize_slices(float* u, int64_t rows, int64_t cols, bool rows_axis, float eps, float gain);
}

class PeriodicRowMuon : public Optimizer {
 public:
  PeriodicRowMuon(std::vector<ParamRef> params, PeriodicRowMuonConfig cfg);
  std::string name() const override { return "prmuon"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;
  // Whether step number t (1-based) is a full Newton-Schulz refresh.
  bool is_refresh(int64_t t) const { return (t - 1) % cfg_.period == 0; }

 private:
  std::vector<ParamRef> params_;
  std::vector<Tensor> momentum_;
  PeriodicRowMuonConfig cfg_;
};

}  // namespace atl
