// Small dense linear algebra the preconditioned optimizers need beyond gemm: symmetric
// eigendecomposition and the Q factor of a QR decomposition, through OpenBLAS's LAPACK
// (ssyevd, sgeqrf/sorgqr). Row-major in, row-major out.
#pragma once
#include <cstdint>

namespace atl::optim {

// A [n,n] symmetric: on return A holds eigenvectors as COLUMNS (A[:, j] for w[j]), w ascending.
void eigh_sym(float* A, float* w, int64_t n);
// A [m,n], m >= n: on return A holds the thin Q factor [m,n] (Householder sign convention, as
// LAPACK and torch.linalg.qr).
void qr_q(float* A, int64_t m, int64_t n);

}  // namespace atl::optim
