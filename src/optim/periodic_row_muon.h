// Periodic Row-wise Muon ("Scaling Muon for Diffusion Transformers"): the full Newton-Schulz update
// of Muon once every K steps (steps 1, K+1, 2K+1, ...), and on the other steps a row-wise
// normalized update from the current momentum, U_i / ||U_i||. Row normalization is elementwise per
// row, so on a row-sharded momentum it needs no communication; only refresh steps gather matrices.
//
// Scaling of the row-normalized update R (row_scale):
//  - "fit" (default): c R with c = <O, R> / <R, R>, fitted at each refresh between the orthogonal
//    update O and the R of the same momentum (the least-squares scale at which the row step best
//    stands in for the Muon step), kept until the next refresh. Why: row normalization keeps a
//    low-rank momentum's dominant direction, so at equal Frobenius norm the row step's spectral
//    norm is up to sqrt(min(m, n)) times the orthogonal step's; measured on the default corpus,
//    pure row steps want ~10x Muon's learning rate less, and one shared rate overshoots.
//  - "frobenius": R rescaled by sqrt(min(m, n) / m) (n for columns), so that its Frobenius norm
//    equals the orthogonal update's.
// Both then take Muon's update scale. axis = "rows" normalizes storage rows (contiguous, the sharding-friendly
// choice), "cols" normalizes columns.
#pragma once
#include <utility>

#include "optim/muon.h"

namespace atl {

struct PeriodicRowMuonConfig {
  MuonConfig muon;
  int period = 4;           // K
  bool normalize_rows = true;  // false: columns
  float eps = 1e-8f;
  // How the non-refresh steps' row-normalized update is scaled: "frobenius" (its Frobenius norm
  // equals the orthogonal update's) or "fit" (by the least-squares factor c = <O, R> / <R, R> that
  // best matches the last refresh's orthogonal update O with that step's row-normalized R).
  bool fit_scale = true;  // row_scale = "fit"; false: "frobenius"
};

namespace optim {
// u[rows, cols] <- each row (or column) divided by its norm + eps, times `gain`.
void normalize_slices(float* u, int64_t rows, int64_t cols, bool rows_axis, float eps, float gain);
// The parts of the fitted row scale c = <O, R> / <R, R>, R = u with each slice divided by its
// norm + eps, over rows [0, rows) of O and u (so a rank holding a block of whole rows, or a
// shard whose slice norms it is given in `norms`, can sum its part): returns {<O, R>, <R, R>}.
// norms: per slice (rows or cols) the full slice norm, or null to compute it from u itself.
std::pair<double, double> row_fit_parts(const float* o, const float* u, int64_t rows, int64_t cols, bool rows_axis,
                                        float eps, const double* norms = nullptr);
inline float row_fit(std::pair<double, double> parts) {
  return parts.second > 0 ? float(parts.first / parts.second) : 1.f;
}
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
  std::vector<float> fit_;  // per matrix: c of the last refresh (fit_scale)
  PeriodicRowMuonConfig cfg_;
};

}  // namespace atl
