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
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/moe_kernels.h"

namespace atl::cpu {

namespace {

constexpr int64_t kRows = 4;   // rows per register tile
constexpr int64_t kCols = 64;  // columns per tile (4 KiB of accumulators per row block)
constexpr int64_t kRowTask = 16;
// Multiply-adds below which a call runs on the calling thread: a team costs microseconds (far
// more on an oversubscribed machine) and a few hundred thousand multiply-adds take about as long.
constexpr int64_t kMinParallelMacs = int64_t(1) << 21;

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

// acc[MR][16] = x[0:MR, :K] · w[:K, 0:16] in 2*MR ymm accumulators: per k two loads of w, MR
// broadcasts and 2*MR FMAs. Explicit FMA (x86-64-v3's baseline, so every CPU atoll targets runs
// this same instruction sequence) rather than a * b + c, which the compiler may or may not fuse
// differently in each instantiation, breaking bit-identity between row blocks.
template <int MR, int NR>
inline void micro(float (&acc)[MR][NR], const float* x, int64_t ldx, const float* w, int64_t ldw, int64_t K) {
  static_assert(NR == 16);
  __m256 a0[MR], a1[MR];
  for (int i = 0; i < MR; ++i) a0[i] = a1[i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m256 w0 = _mm256_loadu_ps(w + k * ldw), w1 = _mm256_loadu_ps(w + k * ldw + 8);
    for (int i = 0; i < MR; ++i) {
      const __m256 b = _mm256_broadcast_ss(x + i * ldx + k);
      a0[i] = _mm256_fmadd_ps(b, w0, a0[i]);
      a1[i] = _mm256_fmadd_ps(b, w1, a1[i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm256_storeu_ps(acc[i], a0[i]);
    _mm256_storeu_ps(acc[i] + 8, a1[i]);
  }
}

template <int MR, int NR>
inline void store(float* y, int64_t ldy, const float (&acc)[MR][NR], int64_t nc, bool accumulate) {
  for (int i = 0; i < MR; ++i)
    for (int64_t c = 0; c < nc; ++c) y[i * ldy + c] = accumulate ? y[i * ldy + c] + acc[i][c] : acc[i][c];
}

template <int MR>
void rows_block(float* y, const float* x, const float* w, int64_t c0, int64_t K, int64_t N, bool accumulate) {
  constexpr int NR = 16;
  const int64_t c1 = std::min(N, c0 + kCols);
  for (int64_t c = c0; c < c1; c += NR) {
    float acc[MR][NR];
    if (c + NR <= N) {
      micro<MR, NR>(acc, x, K, w + c, N, K);
    } else {  // the last columns: w's tail copied into a zero-padded panel, the same sums
      std::vector<float> panel(size_t(K * NR), 0.f);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = c; j < N; ++j) panel[size_t(k * NR + (j - c))] = w[k * N + j];
      micro<MR, NR>(acc, x, K, panel.data(), NR, K);
    }
    store<MR, NR>(y + c, N, acc, std::min<int64_t>(NR, N - c), accumulate);
  }
}

// y[r, c0:c0+kCols] (+)= x[r, :K] · w[:K, c0:c0+kCols] for rows r0..r1, w row stride N.
void tile_forward(float* y, const float* x, const float* w, int64_t r0, int64_t r1, int64_t c0, int64_t K,
                  int64_t N, bool accumulate) {
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) rows_block<4>(y + r * N, x + r * K, w, c0, K, N, accumulate);
  switch (r1 - r) {
    case 3: rows_block<3>(y + r * N, x + r * K, w, c0, K, N, accumulate); break;
    case 2: rows_block<2>(y + r * N, x + r * K, w, c0, K, N, accumulate); break;
    case 1: rows_block<1>(y + r * N, x + r * K, w, c0, K, N, accumulate); break;
    default: break;
  }
}

void grouped(float* y, const float* x, const float* w, const int64_t* off, int64_t G, int64_t K, int64_t N,
             bool accumulate) {
  const std::vector<Task> tasks = make_tasks(off, G, N);
  const int64_t n = int64_t(tasks.size());
#pragma omp parallel for schedule(dynamic, 1) if(parallel : off[G] * K * N >= kMinParallelMacs)
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
#pragma omp parallel for schedule(dynamic, 1) if(parallel : off[G] * K * N >= kMinParallelMacs)
    for (int64_t t = 0; t < n; ++t) {
      const int64_t g = t / (kb * cb), k0 = (t / cb) % kb * kRows, c0 = t % cb * kCols;
      const int64_t nk = std::min(kRows, K - k0), nc = std::min(kCols, N - c0);
      float acc[kRows][kCols] = {};
      for (int64_t r = off[g]; r < off[g + 1]; ++r) {
        const float* dyr = dy + r * N + c0;
        for (int64_t i = 0; i < nk; ++i) {
          const float a = x[r * K + k0 + i];
#pragma omp simd
          for (int64_t c = 0; c < nc; ++c) acc[i][c] = std::fma(a, dyr[c], acc[i][c]);
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
