// Softmax fused with cross-entropy over the vocabulary (llm.c's fused classifier): forward keeps
// only the row's log-sum-exp, backward recomputes softmax from it and overwrites the logits'
// gradient in one pass. Rows whose target is negative are ignored (loss 0, gradient 0). The chunk
// sums are kernel_util.h's exp_sum_seq: in index order wherever the row sits in memory.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

namespace {

// One row of crossentropy_forward: its loss and log-sum-exp.
inline void forward_row(float* loss, float* lse, const float* x, int32_t tgt, int64_t V) {
  // One pass over the row (it does not fit in cache at GPT-2's V): a running max and sum,
  // updated per L1-sized chunk as in the online softmax of Milakov & Gimelshein 2018.
  constexpr int64_t kChunk = 2048;
  float m = -INFINITY, s = 0.0f;
  for (int64_t c0 = 0; c0 < V; c0 += kChunk) {
    const int64_t c1 = std::min(V, c0 + kChunk);
    float cm = -INFINITY;
#pragma omp simd reduction(max : cm)
    for (int64_t v = c0; v < c1; ++v) cm = x[v] > cm ? x[v] : cm;
    if (cm > m) {
      s *= std::exp(m - cm);
      m = cm;
    }
    s += detail::exp_sum_seq(nullptr, x + c0, c1 - c0, m);
  }
  const float l = m + std::log(s);
  if (lse) *lse = l;
  *loss = tgt < 0 ? 0.0f : l - x[tgt];
}

// One row of crossentropy_backward (d may be x itself: each element is read before it is written).
inline void backward_row(float* d, const float* x, float l, float g, int32_t tgt, int64_t V) {
  if (tgt < 0) {
    for (int64_t v = 0; v < V; ++v) d[v] = 0.0f;
    return;
  }
#pragma omp simd
  for (int64_t v = 0; v < V; ++v) d[v] = detail::exp_approx(x[v] - l) * g;
  d[tgt] -= g;
}

void check_targets(const int32_t* targets, int64_t N, int64_t V) {
  for (int64_t i = 0; i < N; ++i)
    ATOLL_CHECK(targets[i] < V, "crossentropy: target {} at row {} is outside the vocabulary of {}",
                targets[i], i, V);
}

}  // namespace

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V) {
  check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if(parallel : N * V >= detail::kMinParallelWork)
  for (int64_t i = 0; i < N; ++i) forward_row(losses + i, lse ? lse + i : nullptr, logits + i * V, targets[i], V);
}

void crossentropy_backward(float* dlogits, const float* dlosses, const float* logits, const float* lse,
                           const int32_t* targets, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static) if(parallel : N * V >= detail::kMinParallelWork)
  for (int64_t i = 0; i < N; ++i) backward_row(dlogits + i * V, logits + i * V, lse[i], dlosses[i], targets[i], V);
}

void crossentropy_rows_bf16(float* losses, float* lse, float* logits, bf16* dlog, const int32_t* targets, float g,
                            int64_t N, int64_t V) {
  check_targets(targets, N, V);
#pragma omp parallel for schedule(static) if(parallel : N * V >= detail::kMinParallelWork)
  for (int64_t i = 0; i < N; ++i) {
    float* x = logits + i * V;
    forward_row(losses + i, lse + i, x, targets[i], V);
    backward_row(x, x, lse[i], g, targets[i], V);  // the row is still in L1/L2
    uint16_t* d = reinterpret_cast<uint16_t*>(dlog + i * V);
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d[v] = detail::bf16_round_bits(x[v]);
  }
}

}  // namespace atl::cpu
