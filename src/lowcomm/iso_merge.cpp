// One-sided Jacobi SVD and Iso-C; see iso_merge.h.
#include "lowcomm/iso_merge.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace atl::lowcomm {

std::vector<double> jacobi_svd(const float* A, int64_t m, int64_t n, std::vector<double>* u,
                               std::vector<double>* vt) {
  // Work on W = A (or A^T when wide) with c >= ... columns being the short side: W [rows, c],
  // rows >= c. Rotations orthogonalise W's columns; then W = U S and the rotations are V.
  const bool wide = n > m;
  const int64_t rows = wide ? n : m, c = wide ? m : n;
  std::vector<double> W(size_t(rows * c)), V(size_t(c * c), 0.0);  // column-major: W[j * rows + i]
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double a = A[i * n + j];
      if (wide) W[size_t(i * rows + j)] = a;  // column i of A^T is row i of A
      else W[size_t(j * rows + i)] = a;
    }
  for (int64_t j = 0; j < c; ++j) V[size_t(j * c + j)] = 1.0;
  const double eps = 1e-15;
  for (int sweep = 0; sweep < 60; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < c - 1; ++p)
      for (int64_t q = p + 1; q < c; ++q) {
        double* wp = &W[size_t(p * rows)];
        double* wq = &W[size_t(q * rows)];
        double alpha = 0, beta = 0, gamma = 0;
        for (int64_t i = 0; i < rows; ++i) {
          alpha += wp[i] * wp[i];
          beta += wq[i] * wq[i];
          gamma += wp[i] * wq[i];
        }
        if (gamma == 0 || std::abs(gamma) <= eps * std::sqrt(alpha * beta)) continue;
        off = std::max(off, std::abs(gamma) / std::sqrt(alpha * beta));
        double zeta = (beta - alpha) / (2 * gamma);
        double t = (zeta >= 0 ? 1.0 : -1.0) / (std::abs(zeta) + std::sqrt(1 + zeta * zeta));
        double cs = 1 / std::sqrt(1 + t * t), sn = cs * t;
        for (int64_t i = 0; i < rows; ++i) {
          double x = wp[i], y = wq[i];
          wp[i] = cs * x - sn * y;
          wq[i] = sn * x + cs * y;
        }
        double* vp = &V[size_t(p * c)];
        double* vq = &V[size_t(q * c)];
        for (int64_t i = 0; i < c; ++i) {
          double x = vp[i], y = vq[i];
          vp[i] = cs * x - sn * y;
          vq[i] = sn * x + cs * y;
        }
      }
    if (off <= eps) break;
  }
  std::vector<double> s(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) {
    double ss = 0;
    for (int64_t i = 0; i < rows; ++i) ss += W[size_t(j * rows + i)] * W[size_t(j * rows + i)];
    s[size_t(j)] = std::sqrt(ss);
  }
  std::vector<int64_t> order(static_cast<size_t>(c));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[size_t(a)] > s[size_t(b)]; });
  std::vector<double> sorted(static_cast<size_t>(c));
  for (int64_t k = 0; k < c; ++k) sorted[size_t(k)] = s[size_t(order[size_t(k)])];
  if (u || vt) {
    // Left vectors of W: its normalised columns (a zero column gets a zero vector: it carries no
    // weight in U S V^T). Right vectors: V's columns. For a wide A the roles swap.
    std::vector<double> L(size_t(rows * c), 0.0), R(size_t(c * c));
    for (int64_t k = 0; k < c; ++k) {
      int64_t j = order[size_t(k)];
      double sj = s[size_t(j)];
      for (int64_t i = 0; i < rows; ++i) L[size_t(i * c + k)] = sj > 0 ? W[size_t(j * rows + i)] / sj : 0.0;
      for (int64_t i = 0; i < c; ++i) R[size_t(i * c + k)] = V[size_t(j * c + i)];  // R [c, c]: column k
    }
    // A = L S R^T (tall) or A = R S L^T (wide).
    std::vector<double> U, Vt;
    if (!wide) {
      U = L;  // [m, r]
      Vt.assign(size_t(c * n), 0.0);
      for (int64_t k = 0; k < c; ++k)
        for (int64_t j = 0; j < n; ++j) Vt[size_t(k * n + j)] = R[size_t(j * c + k)];
    } else {
      U = R;  // [m, r], m = c
      Vt.assign(size_t(c * n), 0.0);
      for (int64_t k = 0; k < c; ++k)
        for (int64_t j = 0; j < n; ++j) Vt[size_t(k * n + j)] = L[size_t(j * c + k)];
    }
    if (u) *u = std::move(U);
    if (vt) *vt = std::move(Vt);
  }
  return sorted;
}

void iso_c(float* A, int64_t m, int64_t n) {
  std::vector<double> U, Vt;
  std::vector<double> s = jacobi_svd(A, m, n, &U, &Vt);
  const int64_t r = int64_t(s.size());
  double mean = 0;
  for (double x : s) mean += x;
  mean /= double(r);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < r; ++k) acc += U[size_t(i * r + k)] * Vt[size_t(k * n + j)];
      A[i * n + j] = float(mean * acc);
    }
}

}  // namespace atl::lowcomm
