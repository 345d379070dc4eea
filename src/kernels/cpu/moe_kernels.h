// CPU kernels of mixture-of-experts layers: the grouped GEMM over tokens sorted by expert
// (grouped_gemm.cpp) and the router's elementwise pieces (moe_router.cpp). Conventions as in
// kernels.h (row-major raw pointers, backward kernels ACCUMULATE); reached from autograd through
// the dispatch table's `moe` family (kernels/dispatch.h).
#pragma once
#include <cstdint>

namespace atl::cpu {

// grouped_gemm.cpp. x [M,K] rows sorted by group, off [G+1] (off[0] = 0, off[G] = M), w [G,K,N]:
// y[off[g]:off[g+1]] = x[off[g]:off[g+1]] · w[g].
void grouped_gemm_forward(float* y, const float* x, const float* w, const int64_t* off, int64_t G, int64_t K,
                          int64_t N);
// dx += dy · w_g^T, dw_g += x_g^T · dy_g (either output may be null).
void grouped_gemm_backward(float* dx, float* dw, const float* dy, const float* x, const float* w, const int64_t* off,
                           int64_t G, int64_t K, int64_t N);
// The same forward as a loop of one BLAS GEMM per group (the baseline grouped GEMM replaces; the
// tests' reference and the ladder's first row).
void grouped_gemm_loop(float* y, const float* x, const float* w, const int64_t* off, int64_t G, int64_t K,
                       int64_t N);

// moe_router.cpp
void sigmoid_forward(float* out, const float* inp, int64_t n);
void sigmoid_backward(float* dinp, const float* dout, const float* out, int64_t n);
// y[r] = x[r] / sum(x[r]) over rows of C (router weights renormalised over the chosen experts).
void normalize_rows_forward(float* y, const float* x, int64_t N, int64_t C);
void normalize_rows_backward(float* dx, const float* dy, const float* x, int64_t N, int64_t C);

}  // namespace atl::cpu
