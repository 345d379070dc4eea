// Softmax fused with cross-entropy over the vocabulary (llm.c's fused classifier): forward keeps
// only the row's log-sum-exp, backward recomputes softmax from it and overwrites the logits'
// gradient in one pass. Rows whose target is negative are ignored (loss 0, gradient 0).
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

void crossentropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V) {
  for (int64_t i = 0; i < N; ++i)
    ATOLL_CHECK(targets[i] < V, "crossentropy: target {} at row {} is outside the vocabulary of {}",
                targets[i], i, V);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = logits + i * V;
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t v = 0; v < V; ++v) m = x[v] > m ? x[v] : m;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t v = 0; v < V; ++v) s += detail::exp_approx(x[v] - m);
    const float l = m + std::log(s);
    if (lse) lse[i] = l;
    losses[i] = targets[i] < 0 ? 0.0f : l - x[targets[i]];
  }
}

void crossentropy_backward(float* dlogits, const float* dlosses, const float* logits, const float* lse,
                           const int32_t* targets, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* x = logits + i * V;
    float* d = dlogits + i * V;  // may be x itself: each element is read before it is written
    const int32_t tgt = targets[i];
    if (tgt < 0) {
      for (int64_t v = 0; v < V; ++v) d[v] = 0.0f;
      continue;
    }
    const float l = lse[i], g = dlosses[i];
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d[v] = detail::exp_approx(x[v] - l) * g;
    d[tgt] -= g;
  }
}

}  // namespace atl::cpu
