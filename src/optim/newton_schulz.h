// Orthogonalization for the Muon family: an odd matrix polynomial iterated on G/||G||_F drives
// every singular value towards 1, approximating the polar factor U V^T of G = U S V^T.
//
// Schedules (coefficients (a, b, c) of p(x) = a x + b x^3 + c x^5, one triple per iteration):
//  - quintic: Jordan's (3.4445, -4.7750, 2.0315) at every step (Muon). It does not converge: after
//    5 steps the singular values lie in about [0.7, 1.2], which is all Muon needs.
//  - polar_express: Amsel, Persson, Musco & Gower, "The Polar Express" (arXiv 2505.16932),
//    Algorithm 1: minimax-optimal per-iteration polynomials with the paper's 1.01 safety factor;
//    converges to 1 (within a few 1e-3 after 8 steps on well-conditioned inputs).
// Forms:
//  - plain: X <- a X + (b A + c A^2) X with A = X X^T (X made wide first).
//  - gram (Dion3, "Gram Newton-Schulz"): every p(X) is Q(R) X with R = X X^T, so iterate on the
//    small m x m Gram matrix R and apply the accumulated Q to X once; a restart re-forms X and R
//    exactly to stop the round-off in R from growing (at the iterations listed in gram_restarts).
//    For wide m x n matrices this trades 4 m^2 n flops per iteration for about 8 m^3.
// Precision: f32, or bf16: every product takes bf16 operands with fp32 accumulation
// (cpu::gemm_bf16, AVX-512 BF16 where the CPU has it) and every iterate is rounded to bf16, as a
// bf16 PyTorch implementation does.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace atl {
class Config;
}

namespace atl::optim {

enum class NsSchedule { quintic, polar_express };
enum class NsPrecision { f32, bf16 };

struct NsOptions {
  NsSchedule schedule = NsSchedule::quintic;
  int steps = 5;
  NsPrecision precision = NsPrecision::f32;
  bool gram = false;
  // With gram on, matrices whose long/short side ratio is below this use the plain form: on a
  // square matrix the Gram matrix is as large as X and the Gram form costs more (0: always Gram).
  float gram_min_aspect = 0.f;
  std::vector<int> gram_restarts = {2};
  float eps = 1e-7f;
};

NsSchedule parse_ns_schedule(const std::string& s);
NsPrecision parse_ns_precision(const std::string& s);
// Reads ns_schedule, ns_steps, ns_precision, ns_gram, ns_gram_min_aspect (default 2) and
// ns_gram_restarts from a config section.
NsOptions ns_options_from_config(Config& cfg, const std::string& section, const NsOptions& defaults = {});

// The (a, b, c) used at each of `steps` iterations.
std::vector<std::array<float, 3>> ns_coefficients(NsSchedule s, int steps);

// out[rows, cols] = approximate polar factor of G[rows, cols] (row-major). out may alias G.
// Standalone on purpose: a distributed owner rank calls exactly this on the matrices it owns.
void orthogonalize(const float* G, float* out, int64_t rows, int64_t cols, const NsOptions& opt);

// Floating-point operations of one orthogonalize call (for benchmarks).
double ns_flops(int64_t rows, int64_t cols, const NsOptions& opt);

}  // namespace atl::optim
