// SOAP (Vyas et al., "SOAP: Improving and Stabilizing Shampoo using Adam", 2024; at scale in "SOAP,
// Muon, and Beyond"): Adam run in the eigenbasis of Shampoo's Kronecker factors. For W [m, n]:
//   L <- lerp(L, G G^T, 1 - shampoo_beta);  R <- lerp(R, G^T G, 1 - shampoo_beta)
//   G' = QL^T G QR;  M <- lerp(M, G, 1 - beta1) (original space);  V <- lerp(V, G'^2, 1 - beta2)
//   W <- W - lr * sqrt(1 - beta2^t)/(1 - beta1^t) * QL ((QL^T M QR) / (sqrt(V) + eps)) QR^T
//   W <- W - lr * wd * W
// The bases come from an eigendecomposition on the first step (which makes no update, as in the
// reference implementation) and are then refreshed every F steps by one power iteration and a QR
// decomposition, QL <- qr(L QL), after sorting QL's columns (and V) by the estimated eigenvalues
// diag(QL^T L QL). A side longer than max_precond_dim keeps the identity basis.
//
// Options beyond the original (NVIDIA Emerging-Optimizers' SOAP has the first two):
//  - precondition_frequency = 1 refreshes the bases by power iteration + QR at every step;
//  - factor_update = "kl": KL-Shampoo factors (Lin et al., arXiv 2509.03378),
//      L <- lerp(L, G QR diag(lR)^-1 QR^T G^T / n, 1 - sb), R <- lerp(R, G^T QL diag(lL)^-1 QL^T G / m, ..)
//    with l = diag(Q^T F Q) from the last basis update, clamped to eps (1 on the first step);
//  - correct_shampoo_bias: sb_t = 1 - (1 - sb)/(1 - sb^t), so the factors are unbiased EMAs;
//  - update_rms > 0: the preconditioned update is rescaled to that RMS (bias correction then
//    cancels), so that one learning rate means the same step size as AdamW's or RMS-scaled Muon's.
#pragma once
#include "optim/optimizer.h"

namespace atl {

struct SoapConfig {
  float lr = 3e-3f, beta1 = 0.95f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.f;
  float shampoo_beta = -1.f;  // < 0: use beta2
  int precondition_frequency = 10;  // F
  int64_t max_precond_dim = 4096;
  bool kl_factors = false;             // factor_update = "kl"
  bool correct_shampoo_bias = false;
  float update_rms = 0.f;              // 0: off
};

class Soap : public Optimizer {
 public:
  Soap(std::vector<ParamRef> params, SoapConfig cfg);
  std::string name() const override { return "soap"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;

 private:
  struct State {
    Tensor m, v, L, R, QL, QR, lL, lR;  // L/QL/lL or R/QR/lR undefined for a side without preconditioning;
                                        // lL, lR: eigenvalue estimates (kl_factors only)
  };
  void update_preconditioner(size_t i, const float* g, bool refresh);
  void project(size_t i, const float* in, float* out, bool back);
  std::vector<ParamRef> params_;
  std::vector<State> st_;
  SoapConfig cfg_;
};

}  // namespace atl
