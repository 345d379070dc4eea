// LAPACK wrappers; see linalg.h. LAPACK is column-major, so the row-major matrices are transposed
// on the way in and out (the matrices here are the small Kronecker factors of SOAP).
#include "optim/linalg.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "core/error.h"

extern "C" {
void ssyevd_(const char* jobz, const char* uplo, const int* n, float* a, const int* lda, float* w, float* work,
             const int* lwork, int* iwork, const int* liwork, int* info);
void sgeqrf_(const int* m, const int* n, float* a, const int* lda, float* tau, float* work, const int* lwork,
             int* info);
void sorgqr_(const int* m, const int* n, const int* k, float* a, const int* lda, const float* tau, float* work,
             const int* lwork, int* info);
}

namespace atl::optim {

void eigh_sym(float* A, float* w, int64_t n64) {
  int n = int(n64), info = 0, lwork = -1, liwork = -1, iq = 0;
  float wq = 0;
  // Symmetric: row-major and column-major storage coincide on input.
  ssyevd_("V", "U", &n, A, &n, w, &wq, &lwork, &iq, &liwork, &info);
  lwork = int(wq) + 1;
  liwork = iq + 1;
  std::vector<float> work(static_cast<size_t>(lwork));
  std::vector<int> iwork(static_cast<size_t>(liwork));
  ssyevd_("V", "U", &n, A, &n, w, work.data(), &lwork, iwork.data(), &liwork, &info);
  ATOLL_CHECK(info == 0, "eigh: LAPACK ssyevd failed (info {}) on a {}x{} matrix (NaN or Inf in the input?)",
              info, n, n);
  // Column-major eigenvectors are row-major rows: transpose so that columns are eigenvectors.
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) std::swap(A[int64_t(i) * n + j], A[int64_t(j) * n + i]);
}

void qr_q(float* A, int64_t m64, int64_t n64) {
  int m = int(m64), n = int(n64), info = 0, lwork = -1;
  ATOLL_CHECK(m >= n, "qr: need rows >= cols, got {}x{}", m, n);
  std::vector<float> cm(static_cast<size_t>(m) * n), tau(static_cast<size_t>(n));
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) cm[size_t(j) * m + i] = A[int64_t(i) * n + j];
  float wq = 0;
  sgeqrf_(&m, &n, cm.data(), &m, tau.data(), &wq, &lwork, &info);
  lwork = std::max(int(wq), n) + 1;
  std::vector<float> work(static_cast<size_t>(lwork));
  sgeqrf_(&m, &n, cm.data(), &m, tau.data(), work.data(), &lwork, &info);
  ATOLL_CHECK(info == 0, "qr: LAPACK sgeqrf failed (info {})", info);
  lwork = -1;
  sorgqr_(&m, &n, &n, cm.data(), &m, tau.data(), &wq, &lwork, &info);
  lwork = std::max(int(wq), n) + 1;
  work.resize(size_t(lwork));
  sorgqr_(&m, &n, &n, cm.data(), &m, tau.data(), work.data(), &lwork, &info);
  ATOLL_CHECK(info == 0, "qr: LAPACK sorgqr failed (info {})", info);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) A[int64_t(i) * n + j] = cm[size_t(j) * m + i];
}

}  // namespace atl::optim
