// Grouped GEMM for mixture-of-experts layers: the rows of x are sorted by group (expert) and
// group g's rows [off[g], off[g+1]) multiply that group's own matrix w[g]. One call covers every
// group: the work is cut into (group, row tile, column tile) tasks scheduled over one OpenMP
// team, so many small experts keep every core busy where a loop of small GEMMs would leave most
// of them idle (the grouped GEMM of Megablocks, Gale et al. 2022, and of CUTLASS, on the CPU).
//
// Every output element is summed in a fixed order (ascending k in the forward and dx, ascending
// row in dw) that does not depend on the group sizes, the tile a row falls in or the thread count,
// so a row gives bit-identical results whichever rank, batch or thread computes it. That is what
// makes expert parallelism reproduce one rank exactly (tests/parallel/test_expert_parallel.cpp).
#include <algorithm>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/moe_kernels.h"

namespace atl::cpu {

namespace {

constexpr int64_t kRows = 4;   // rows per register tile
constexpr int64_t kCols = 64;  // columns per tile (4 KiB of accumulators per row block)
constexpr int64_t kRowTask = 16;

struct Task {
  int64_t g, r0, r1, c0;
};

// Tasks over every group's rows (kRowTask at a time) and the N columns (kCols at a time).
std::vector<Task> make_tasks(const int64_t* off, int64_t G, int64_t N) {
  std::vector<Task> t;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t r = off[g]; r < off[g + 1]; r += kRowTask)
      for (int64_t c = 0; c < N; c += kCols) t.push_back({g, r, std::min(off[g + 1], r + kRowTask), c});
  return t;
}

// y[r, c0:c1] (+)= x[r, :K] · w[:K, c0:c1] for rows r0..r1, w row stride N.
void tile_forward(float* y, const float* x, const float* w, int64_t r0, int64_t r1, int64_t c0, int64_t K,
                  int64_t N, bool accumulate) {
  const int64_t nc = std::min(kCols, N - c0);
  for (int64_t r = r0; r < r1; r += kRows) {
    const int64_t nr = std::min(kRows, r1 - r);
    float acc[kRows][kCols] = {};
    for (int64_t k = 0; k < K; ++k) {
      const float* wk = w + k * N + c0;
      for (int64_t i = 0; i < nr; ++i) {
        const float a = x[(r + i) * K + k];
#pragma omp simd
        for (int64_t c = 0; c < nc; ++c) acc[i][c] += a * wk[c];
      }
    }
    for (int64_t i = 0; i < nr; ++i) {
      float* yr = y + (r + i) * N + c0;
      if (accumulate)
        for (int64_t c = 0; c < nc; ++c) yr[c] += acc[i][c];
      else
        for (int64_t c = 0; c < nc; ++c) yr[c] = acc[i][c];
    }
  }
}

void grouped(float* y, const float* x, const float* w, const int64_t* off, int64_t G, int64_t K, int64_t N,
             bool accumulate) {
  const std::vector<Task> tasks = make_tasks(off, G, N);
  const int64_t n = int64_t(tasks.size());
#pragma omp parallel for schedule(dynamic, 1) if(parallel : off[G] * K * N >= detail::kMinParallelWork)
  for (int64_t t = 0; t < n; ++t) {
    const Task& a = tasks[size_t(t)];
    tile_forward(y, x, w + a.g * K * N, a.r0, a.r1, a.c0, K, N, accumulate);
  }
}

}  // namespace

void grouped_gemm_forward(float* y, const float* x, const float* w, const int64_t* off, int64_t G, int64_t K,
                          int64_t N) {
  grouped(y, x, w, off, G, K, N, /*accumulate=*/false);
}

void grouped_gemm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const int64_t* off,
                           int64_t G, int64_t K, int64_t N) {
  if (dx) {
    // dx = dy · w_g^T: transpose each w_g to [N, K] once, then the forward's tiles (order over n fixed).
    std::vector<float> wt(size_t(G * K * N));
#pragma omp parallel for schedule(static) if(parallel : G * K * N >= detail::kMinParallelWork)
    for (int64_t gk = 0; gk < G * K; ++gk) {
      const int64_t g = gk / K, k = gk % K;
      const float* src = w + gk * N;
      float* dst = wt.data() + g * K * N + k;
      for (int64_t c = 0; c < N; ++c) dst[c * K] = src[c];
    }
    grouped(dx, dy, wt.data(), off, G, N, K, /*accumulate=*/true);
  }
  if (dw) {
    // dw_g[k, c] += sum over the group's rows r, ascending, of x[r, k] dy[r, c].
    const int64_t kb = (K + kRows - 1) / kRows, cb = (N + kCols - 1) / kCols, n = G * kb * cb;
#pragma omp parallel for schedule(dynamic, 1) if(parallel : off[G] * K * N >= detail::kMinParallelWork)
    for (int64_t t = 0; t < n; ++t) {
      const int64_t g = t / (kb * cb), k0 = (t / cb) % kb * kRows, c0 = t % cb * kCols;
      const int64_t nk = std::min(kRows, K - k0), nc = std::min(kCols, N - c0);
      float acc[kRows][kCols] = {};
      for (int64_t r = off[g]; r < off[g + 1]; ++r) {
        const float* dyr = dy + r * N + c0;
        for (int64_t i = 0; i < nk; ++i) {
          const float a = x[r * K + k0 + i];
#pragma omp simd
          for (int64_t c = 0; c < nc; ++c) acc[i][c] += a * dyr[c];
        }
      }
      for (int64_t i = 0; i < nk; ++i) {
        float* d = dw + g * K * N + (k0 + i) * N + c0;
        for (int64_t c = 0; c < nc; ++c) d[c] += acc[i][c];
      }
    }
  }
}

void grouped_gemm_loop(float* y, const float* x, const float* w, const int64_t* off, int64_t G, int64_t K,
                       int64_t N) {
  for (int64_t g = 0; g < G; ++g) {
    const int64_t m = off[g + 1] - off[g];
    if (m > 0) gemm(false, false, m, N, K, 1.f, x + off[g] * K, K, w + g * K * N, N, 0.f, y + off[g] * N, N);
  }
}

}  // namespace atl::cpu
