// CPU kernels of the op set beyond the GPT block (batched matmul, softmax, index and sparse
// aggregation, top-k, SiLU, broadcast multiply, row copies, reductions, masked attention, dropout).
// Same conventions as kernels.h: row-major raw pointers, backward kernels ACCUMULATE into their
// gradient outputs. Reached from autograd through the dispatch table (kernels/dispatch.h), whose
// family structs document each signature.
#pragma once
#include <cstdint>

#include "kernels/dispatch.h"

namespace atl::cpu {

// batched_matmul.cpp
void bmm_forward(float* c, const float* a, const float* b, int64_t batch, int64_t M, int64_t K, int64_t N);
void bmm_backward(float* da, float* db, const float* dc, const float* a, const float* b, int64_t batch, int64_t M,
                  int64_t K, int64_t N);

// softmax.cpp
void softmax_forward(float* y, const float* x, int64_t N, int64_t C, bool log);
void softmax_backward(float* dx, const float* dy, const float* y, int64_t N, int64_t C, bool log);

// index.cpp
void gather_rows(float* out, const float* x, const int32_t* idx, int64_t O, int64_t N, int64_t M, int64_t I);
void scatter_rows(float* out, const float* src, const int32_t* idx, int64_t O, int64_t N, int64_t M, int64_t I);
void gather_elems(float* out, const float* x, const int32_t* idx, int64_t O, int64_t N, int64_t K, int64_t I);
void scatter_elems(float* out, const float* src, const int32_t* idx, int64_t O, int64_t N, int64_t K, int64_t I);

// topk.cpp
void topk_forward(float* values, int32_t* indices, const float* x, int64_t N, int64_t C, int64_t k);
void topk_backward(float* dx, const float* dvalues, const int32_t* indices, int64_t N, int64_t C, int64_t k);

// silu.cpp
void silu_forward(float* out, const float* inp, int64_t n);
void silu_backward(float* dinp, const float* dout, const float* inp, int64_t n);

// broadcast_mul.cpp
void mul_forward(float* out, const float* a, const float* b, const kernels::Broadcast& bc);
void mul_backward(float* da, float* db, const float* dout, const float* a, const float* b,
                  const kernels::Broadcast& bc);

// copy_fill.cpp
void copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t width,
               bool accumulate);
void fill(float* x, float v, int64_t n);
void add_scalar(float* x, float v, int64_t n);     // x += v
void axpy(float* y, float a, const float* x, int64_t n);  // y += a x

// reduce.cpp
double sum(const float* x, int64_t n);
double dot(const float* x, const float* y, int64_t n);
double sq_diff_sum(const float* p, const float* t, int64_t n);
void sq_diff_backward(float* dp, float* dt, const float* p, const float* t, int64_t n, float g);

// attention_block.cpp
void attention_block_forward(float* out, float* lse, const float* q, int64_t q_stride, const float* kv,
                             const kernels::AttentionRanges& r, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV,
                             int64_t hd);
void attention_block_backward(float* dq, float* dkv, const float* dout, const float* D, const float* lse, const float* q,
                              int64_t q_stride, const float* kv, const kernels::AttentionRanges& r, int64_t B, int64_t Tq,
                              int64_t Tk, int64_t H, int64_t KV, int64_t hd);
// attention_ranged.cpp
void attention_ranged_forward(float* out, float* lse, const float* qkv, const kernels::AttentionRanges& r, int64_t B,
                              int64_t T, int64_t H, int64_t KV, int64_t hd);
void attention_ranged_backward(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                               const kernels::AttentionRanges& r, int64_t B, int64_t T, int64_t H, int64_t KV,
                               int64_t hd);

// dropout.cpp (the key: kernels/dropout_mask.h)
void dropout_forward(float* out, const float* x, int64_t n, float p, uint64_t key);
void dropout_backward(float* dx, const float* dout, int64_t n, float p, uint64_t key);

}  // namespace atl::cpu
