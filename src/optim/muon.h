// Muon: MomentUm Orthogonalized by Newton-Schulz (Jordan et al., 2024; "Muon is scalable for LLM
// training", Liu et al., 2025). For each hidden weight matrix W with gradient G:
//   M <- beta M + (1 - beta) G;   U = nesterov ? (1 - beta) G + beta M : M
//   W <- W (1 - lr wd) - lr * scale(rows, cols) * orthogonalize(U)
// The step is split into three free functions (momentum, orthogonalize, apply) so that a
// distributed scheme can run the local, elementwise parts on every rank and the orthogonalization
// on the matrix's owner only (DMuon).
#pragma once
#include "optim/newton_schulz.h"
#include "optim/optim_util.h"
#include "optim/optimizer.h"

namespace atl {

struct MuonConfig {
  float lr = 0.02f;
  float momentum = 0.95f;
  bool nesterov = true;
  float weight_decay = 0.f;
  optim::UpdateScale scale = optim::UpdateScale::keller;
  optim::Layout layout = optim::Layout::in_out;
  optim::NsOptions ns;
};

namespace optim {
// M <- lerp(M, s g, 1 - beta); u = nesterov ? lerp(s g, M, beta) : M (u may alias nothing else).
void muon_momentum(float* M, const float* g, float* u, int64_t n, float beta, bool nesterov, float grad_scale);
// W <- W (1 - lr wd) - lr * scale * O: decoupled weight decay, then the step.
void apply_scaled_update(float* W, const float* O, int64_t n, float lr, float scale, float weight_decay);
}  // namespace optim

class Muon : public Optimizer {
 public:
  Muon(std::vector<ParamRef> params, MuonConfig cfg);
  std::string name() const override { return "muon"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;
  const MuonConfig& config() const { return cfg_; }

 protected:
  std::vector<ParamRef> params_;
  std::vector<Tensor> momentum_;
  MuonConfig cfg_;
};

}  // namespace atl
