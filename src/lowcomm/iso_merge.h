// Iso-C (Marczak et al., "No Task Left Behind: Isotropic Model Merging with Common and
// Task-Specific Subspaces", 2025), as IsoLoCo uses it for DiLoCo's pseudo-gradients ("Can Model
// Merging Improve Aggregation in DiLoCo?"): a matrix's singular values replaced by their mean,
//   A = U S V^T  ->  mean(S) U V^T,
// keeping its directions and flattening its spectrum. The SVD is one-sided Jacobi (Hestenes) in
// double precision: small and accurate, deterministic (every rank computes the same bits), and
// fast enough for the matrices of the models trained across islands here.
#pragma once
#include <cstdint>
#include <vector>

namespace atl::lowcomm {

// A [m, n] row-major. Returns the singular values (descending) and, when u/vt are given, the
// thin factors U [m, r] and V^T [r, n] (r = min(m, n)), row-major.
std::vector<double> jacobi_svd(const float* A, int64_t m, int64_t n, std::vector<double>* u = nullptr,
                               std::vector<double>* vt = nullptr);
// In place: A <- mean(singular values of A) * U V^T.
void iso_c(float* A, int64_t m, int64_t n);

}  // namespace atl::lowcomm
