// The device dispatch point: autograd ops reach kernels only through a table of function pointers
// keyed by (device kind, dtype), so a backend adds kernels by registering its table here, without
// editing autograd/ops. The signatures are the CPU kernels' (kernels/cpu/kernels.h, op_set.h):
// raw pointers into the tensors' storage, which on a CUDA table are device pointers.
//
// One struct per op family, one table per (device, dtype). The CPU fp32 table is built in
// kernels/cpu/table_f32.cpp; a backend that lacks a family leaves its pointers null and ops report
// which kernel is missing on which device. Looking up an unregistered (device, dtype) is an error
// naming both.
#pragma once
#include <cstdint>

#include "kernels/broadcast.h"
#include "tensor/dtype.h"

namespace atl::kernels {

struct GemmKernels {
  void (*gemm)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
  // C_i = A_i · B_i over `batch` row-major [M,K]·[K,N]; backward accumulates.
  void (*bmm_forward)(float* c, const float* a, const float* b, int64_t batch, int64_t M, int64_t K, int64_t N);
  void (*bmm_backward)(float* da, float* db, const float* dc, const float* a, const float* b, int64_t batch,
                       int64_t M, int64_t K, int64_t N);
};

struct LinearKernels {
  void (*forward)(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int64_t C,
                  int64_t OC);
  void (*backward)(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                   const float* weight, int64_t N, int64_t C, int64_t OC);
};

struct EmbeddingKernels {
  void (*forward)(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t B, int64_t T,
                  int64_t C);
  void (*backward)(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t B, int64_t T,
                   int64_t C);
};

struct NormKernels {
  void (*layernorm_forward)(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                            const float* bias, int64_t N, int64_t C, float eps);
  void (*layernorm_backward)(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, const float* mean, const float* rstd, int64_t N, int64_t C);
  void (*rmsnorm_forward)(float* out, float* rstd, const float* inp, const float* weight, int64_t N, int64_t C,
                          float eps);
  void (*rmsnorm_backward)(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                           const float* rstd, int64_t N, int64_t C);
};

struct ActivationKernels {
  void (*gelu_forward)(float* out, const float* inp, int64_t n);
  void (*gelu_backward)(float* dinp, const float* dout, const float* inp, int64_t n);
  void (*silu_forward)(float* out, const float* inp, int64_t n);
  void (*silu_backward)(float* dinp, const float* dout, const float* inp, int64_t n);
  void (*swiglu_forward)(float* out, const float* inp, int64_t N, int64_t F);
  void (*swiglu_backward)(float* dinp, const float* dout, const float* inp, int64_t N, int64_t F);
};

struct ElementwiseKernels {
  void (*add_forward)(float* out, const float* a, const float* b, int64_t n);
  void (*add_inplace)(float* acc, const float* x, int64_t n);
  void (*fill)(float* x, float v, int64_t n);
  void (*add_scalar)(float* x, float v, int64_t n);          // x += v
  void (*axpy)(float* y, float a, const float* x, int64_t n);  // y += a x
  void (*mul_forward)(float* out, const float* a, const float* b, const Broadcast& bc);
  void (*mul_backward)(float* da, float* db, const float* dout, const float* a, const float* b, const Broadcast& bc);
  // dst[r, 0..width) (+)= src[r, 0..width) over rows with row strides (concat and split).
  void (*copy_rows)(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows, int64_t width,
                    bool accumulate);
  // Counter-based dropout: the mask is a function of (key, element index) only.
  void (*dropout_forward)(float* out, const float* x, int64_t n, float p, uint64_t key);
  void (*dropout_backward)(float* dx, const float* dout, int64_t n, float p, uint64_t key);
};

struct ReduceKernels {
  double (*sum)(const float* x, int64_t n);
  double (*dot)(const float* x, const float* y, int64_t n);
  // Sum of (p - t)^2, and its backward dp += g (p - t), dt -= g (p - t) (either may be null).
  double (*sq_diff_sum)(const float* p, const float* t, int64_t n);
  void (*sq_diff_backward)(float* dp, float* dt, const float* p, const float* t, int64_t n, float g);
};

struct RopeKernels {
  void (*forward)(float* out, const float* inp, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, float theta,
                  int64_t pos_offset);
  void (*backward)(float* dinp, const float* dout, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                   float theta, int64_t pos_offset);
};

// Per-position visible ranges for masked attention, each [B*T]: query t of row b sees keys
// [k_lo, k_hi); key j is seen by queries [q_lo, q_hi). Offsets are within the row.
struct AttentionRanges {
  const int32_t* k_lo;
  const int32_t* k_hi;
  const int32_t* q_lo;
  const int32_t* q_hi;
};

struct AttentionKernels {
  void (*causal_forward)(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t H, int64_t KV,
                         int64_t hd);
  void (*causal_backward)(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                          int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd);
  void (*ranged_forward)(float* out, float* lse, const float* qkv, const AttentionRanges& r, int64_t B, int64_t T,
                         int64_t H, int64_t KV, int64_t hd);
  void (*ranged_backward)(float* dqkv, const float* dout, const float* qkv, const float* out, const float* lse,
                          const AttentionRanges& r, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd);
  // One (query block, key block) pair of a longer row (ring attention, attention_block.cpp):
  // queries from q [B,Tq,*] (row stride q_stride, heads first), keys and values from
  // kv [B,Tk,2*KV*hd] (k heads, then v heads). r.k_lo/k_hi [B*Tq] index kv's rows, r.q_lo/q_hi
  // [B*Tk] q's. Writes this pair's normalised out [B,Tq,H*hd] and lse [B,H,Tq] (-inf, out 0,
  // where a query sees no key of the block).
  void (*block_forward)(float* out, float* lse, const float* q, int64_t q_stride, const float* kv,
                        const AttentionRanges& r, int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t KV, int64_t hd);
  // Accumulates the pair's share of dq (stride q_stride) and dkv [B,Tk,2*KV*hd], from the merged
  // row's lse and D = dO·O (each [B,H,Tq]).
  void (*block_backward)(float* dq, float* dkv, const float* dout, const float* D, const float* lse, const float* q,
                         int64_t q_stride, const float* kv, const AttentionRanges& r, int64_t B, int64_t Tq, int64_t Tk,
                         int64_t H, int64_t KV, int64_t hd);
};

struct SoftmaxKernels {
  void (*crossentropy_forward)(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                               int64_t V);
  void (*crossentropy_backward)(float* dlogits, const float* dlosses, const float* logits, const float* lse,
                                const int32_t* targets, int64_t N, int64_t V);
  // Row softmax (log_softmax when log) over [N,C]; backward accumulates from the saved output.
  void (*forward)(float* y, const float* x, int64_t N, int64_t C, bool log);
  void (*backward)(float* dx, const float* dy, const float* y, int64_t N, int64_t C, bool log);
};

// Index kernels view tensors as [O, N, I] around the indexed dim; all accumulate into `out`.
struct IndexKernels {
  // out[o,m,:] += x[o,idx[m],:]   x [O,N,I], out [O,M,I]   (index_select; segment-sum backward)
  void (*gather_rows)(float* out, const float* x, const int32_t* idx, int64_t O, int64_t N, int64_t M, int64_t I);
  // out[o,idx[m],:] += src[o,m,:] out [O,N,I], src [O,M,I]  (segment-sum; index_select backward)
  void (*scatter_rows)(float* out, const float* src, const int32_t* idx, int64_t O, int64_t N, int64_t M, int64_t I);
  // out[o,k,i] += x[o,idx[o,k,i],i]   x [O,N,I], idx/out [O,K,I]   (gather; scatter-add backward)
  void (*gather_elems)(float* out, const float* x, const int32_t* idx, int64_t O, int64_t N, int64_t K, int64_t I);
  // out[o,idx[o,k,i],i] += src[o,k,i] (scatter-add; gather backward)
  void (*scatter_elems)(float* out, const float* src, const int32_t* idx, int64_t O, int64_t N, int64_t K,
                        int64_t I);
  // Largest k of each row of x [N,C], descending (ties: lower index first), and its backward.
  void (*topk_forward)(float* values, int32_t* indices, const float* x, int64_t N, int64_t C, int64_t k);
  void (*topk_backward)(float* dx, const float* dvalues, const int32_t* indices, int64_t N, int64_t C, int64_t k);
};

// Mixture-of-experts layers (kernels/cpu/moe_kernels.h): x [M,K] sorted by group, off [G+1],
// w [G,K,N]; one call computes every group's rows (never a loop of small GEMMs).
struct MoEKernels {
  void (*grouped_forward)(float* y, const float* x, const float* w, const int64_t* off, int64_t G, int64_t K,
                          int64_t N);
  void (*grouped_backward)(float* dx, float* dw, const float* dy, const float* x, const float* w,
                           const int64_t* off, int64_t G, int64_t K, int64_t N);
  void (*sigmoid_forward)(float* out, const float* inp, int64_t n);
  void (*sigmoid_backward)(float* dinp, const float* dout, const float* out, int64_t n);
  // Rows divided by their sum, and its backward.
  void (*normalize_rows_forward)(float* y, const float* x, int64_t N, int64_t C);
  void (*normalize_rows_backward)(float* dx, const float* dy, const float* x, int64_t N, int64_t C);
};

struct KernelTable {
  const char* name;  // "cpu/f32": for error messages
  GemmKernels gemm;
  LinearKernels linear;
  EmbeddingKernels embedding;
  NormKernels norm;
  ActivationKernels act;
  ElementwiseKernels elem;
  ReduceKernels reduce;
  RopeKernels rope;
  AttentionKernels attention;
  SoftmaxKernels softmax;
  IndexKernels index;
  MoEKernels moe;
};

// The table for (device, dtype); throws atl::Error naming both when none is registered.
const KernelTable& table(Device dev, DType dt);
// Registers (or replaces) the table for a device kind and dtype; `t` must outlive every use.
void register_table(Device::Kind kind, DType dt, const KernelTable* t);

}  // namespace atl::kernels
