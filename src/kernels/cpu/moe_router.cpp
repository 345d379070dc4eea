// The router's elementwise kernels: sigmoid scores (DeepSeek-V3's router) and the renormalisation
// of the chosen experts' weights to sum to one per token (DeepSeek-MoE, Qwen-MoE norm_topk_prob).
#include <cmath>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/moe_kernels.h"

namespace atl::cpu {

void sigmoid_forward(float* out, const float* inp, int64_t n) {
  // std::exp, not the fast approximation: router scores pick experts, and a tie broken
  // differently from the reference would route a token elsewhere.
#pragma omp parallel for schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) out[i] = float(1.0 / (1.0 + std::exp(-double(inp[i]))));
}

void sigmoid_backward(float* dinp, const float* dout, const float* out, int64_t n) {
#pragma omp parallel for schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) dinp[i] += dout[i] * out[i] * (1.f - out[i]);
}

void normalize_rows_forward(float* y, const float* x, int64_t N, int64_t C) {
  for (int64_t r = 0; r < N; ++r) {
    double s = 0;
    for (int64_t c = 0; c < C; ++c) s += x[r * C + c];
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = float(double(x[r * C + c]) / s);
  }
}

void normalize_rows_backward(float* dx, const float* dy, const float* x, int64_t N, int64_t C) {
  // y_c = x_c / S: dx_j = (dy_j - sum_c dy_c y_c) / S.
  for (int64_t r = 0; r < N; ++r) {
    double s = 0, dot = 0;
    for (int64_t c = 0; c < C; ++c) s += x[r * C + c];
    for (int64_t c = 0; c < C; ++c) dot += double(dy[r * C + c]) * (double(x[r * C + c]) / s);
    for (int64_t c = 0; c < C; ++c) dx[r * C + c] += float((double(dy[r * C + c]) - dot) / s);
  }
}

}  // namespace atl::cpu
