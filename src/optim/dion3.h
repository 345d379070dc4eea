// Dion3 (Ahn et al., "Dion3: Full-Stack Orthogonal Updates"; the NorDion2 update of the dion
// package): Muon that orthogonalizes only a fraction alpha of the momentum's slices per step.
//   M <- M + G                                   (error-feedback accumulator, no decay here)
//   S  = the ceil(alpha * #slices) slices of M with the largest L1 norm
//   U  = orthogonalize(M[S]);  M[S] <- mu * M[S] (error feedback: what was applied decays)
//   V[S] <- lerp(V[S], mean_j U_ij^2, 1 - beta2); U_i /= sqrt(V_i) + 1e-8, then U rescaled to
//          its Frobenius norm before the division (NorMuon per-neuron normalization)
//   W <- W (1 - lr wd);  W[S] <- W[S] - lr * scale * U
// A slice is a row or a column: select = "rows", "cols", or "neurons" (the output neurons: the
// columns of an atoll [in, out] weight, the rows of an [out, in] one), "shorter" (Dion2's choice).
// State: M (full) and V (one value per slice).
#pragma once
#include "optim/newton_schulz.h"
#include "optim/optim_util.h"
#include "optim/optimizer.h"

namespace atl {

struct Dion3Config {
  float lr = 0.02f;
  float fraction = 0.25f;  // alpha
  float mu = 0.95f;        // error-feedback decay of the selected slices
  float beta2 = 0.95f;     // per-slice second-moment EMA
  float weight_decay = 0.f;
  std::string select = "neurons";
  optim::UpdateScale scale = optim::UpdateScale::spectral;
  optim::Layout layout = optim::Layout::in_out;
  optim::NsOptions ns;
};

// Dion3's maths, shared with its distributed placement (parallel/optim/dion3_dist.cpp).
namespace dion3 {
// Whether a parameter of these dims selects along rows (else columns), by cfg.select.
bool selects_rows(const Dion3Config& cfg, const optim::MatDims& d);
// The number of slices selected out of n: ceil(fraction * n), at least 1 (0 when n is 0).
int64_t count(float fraction, int64_t n);
// Indices of the k largest norms[0..n) (ties by index, so the choice is deterministic), ascending.
std::vector<int64_t> top_k(const float* norms, int64_t n, int64_t k);
// NorMuon normalization of the k orthogonalized slices O [k, len] (slice s is slices[s] of the
// matrix): V[slices[s]] <- lerp(V, mean_j O_sj^2, 1 - beta2), O_s /= sqrt(V) + 1e-8. Returns the
// factor that rescales O to its Frobenius norm before the division.
float normuon_normalize(float* O, int64_t k, int64_t len, const int64_t* slices, float* V, float beta2);
// W <- W (1 - lr wd) on all n elements.
void decay(float* W, int64_t n, float lr, float weight_decay);
}  // namespace dion3

class Dion3 : public Optimizer {
 public:
  Dion3(std::vector<ParamRef> params, Dion3Config cfg);
  std::string name() const override { return "dion3"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;
  // Whether parameter i selects along rows (else columns).
  bool selects_rows(size_t i) const { return select_rows_[i]; }

 private:
  std::vector<ParamRef> params_;
  std::vector<Tensor> momentum_, variance_;
  std::vector<bool> select_rows_;
  Dion3Config cfg_;
};

}  // namespace atl
