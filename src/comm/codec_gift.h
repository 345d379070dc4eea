// GIFT (seed: "GIFT: Geometry-Informed Low-precision Gradient Communication for LLM Pretraining"):
// a matrix gradient G is quantized in near-isotropic coordinates, G T, and transformed back after
// the reduction; T is linear, so sum_r (G_r T) T^-1 = sum_r G_r and the collective is unchanged.
//
// This implementation's transform (ours; the abstract fixes the idea, not the formula): from a
// rank-k estimate of G's right singular directions Q (cols x k, orthonormal) and singular values
// sigma_i, and the RMS sigma_ref of the rest of the spectrum,
//   T = I + Q diag(d - 1) Q^T,   d_i = clamp(sigma_ref / sigma_i, 1 / max_shrink, 1),
//   T^-1 = I + Q diag(1/d - 1) Q^T,
// which shrinks the k dominant directions to the level of the others. sigma_i and sigma_ref are
// moving averages over steps (beta): the transform is built from the previous steps' gradients,
// and a direction that was dominant once but is not now would get its quantization noise
// amplified by 1/d_i on the way back, so d follows the spectrum smoothly and is floored. Block scales then stop being
// set by the few dominant directions, so the others keep their digits. The estimate is one warm-
// started subspace iteration per step on the previous step's REDUCED gradient, which every rank
// holds bit-identically, so every rank builds the same T with no extra communication. "Applied
// only where it pays": a matrix is transformed only when it is large enough (numel >= min_numel,
// min(rows, cols) > 2k) and anisotropic enough (sigma_1 / sigma_ref >= min_anisotropy).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace atl::comm {

struct GiftOptions {
  int rank = 4;                 // k
  double min_anisotropy = 3.0;  // transform only when sigma_1 / sigma_ref reaches this
  int64_t min_numel = 4096;
  double max_shrink = 16.0;     // d_i >= 1 / max_shrink: how much inverse() may amplify rounding
  double beta = 0.9;            // EMA of the spectrum estimates over steps (0: the last step only)
};

class GiftTransform {
 public:
  GiftTransform(int64_t rows, int64_t cols, GiftOptions opt = {});
  // Whether forward/inverse change anything (false until observe() has seen an anisotropic G).
  bool active() const { return active_; }
  // g (rows x cols, row-major) <- g T, resp. g T^-1; identity when inactive.
  void forward(float* g) const { apply(g, false); }
  void inverse(float* g) const { apply(g, true); }
  // Updates the geometry from a gradient every rank holds identically (deterministic: no threads
  // in its reductions).
  void observe(const float* g);
  double anisotropy() const { return anisotropy_; }  // sigma_1 / sigma_ref at the last observe()
  double max_ratio() const;  // largest 1/d_i: how much inverse() may amplify rounding
  // The learned geometry as doubles (flags, spectrum EMAs, d, Q), for a bit-exact resume, and its
  // inverse (the same shape and options, else refused naming `what`).
  std::vector<double> save() const;
  void load(const std::vector<double>& v, const std::string& what);

 private:
  void apply(float* g, bool inverse) const;
  int64_t rows_, cols_;
  int k_;
  GiftOptions opt_;
  std::vector<double> q_;  // k columns of length cols_, column-major
  std::vector<double> d_, sig2_;
  double ref2_ = 0;
  bool seen_ = false;
  bool active_ = false;
  double anisotropy_ = 1.0;
};

}  // namespace atl::comm
