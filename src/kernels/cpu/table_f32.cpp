// The CPU fp32 kernel table (kernels/dispatch.h): every CPU kernel autograd reaches, by family.
// ISA choices happen inside the kernels at run time (gemm.h), so one table serves every x86-64 CPU.
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/moe_kernels.h"
#include "kernels/cpu/op_set.h"

namespace atl::cpu {

namespace {

void gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

const kernels::KernelTable kCpuF32 = {
    "cpu/f32",
    {gemm_f32, bmm_forward, bmm_backward},
    {linear_forward, linear_backward},
    {embedding_forward, embedding_backward},
    {layernorm_forward, layernorm_backward, rmsnorm_forward, rmsnorm_backward},
    {gelu_forward, gelu_backward, silu_forward, silu_backward, swiglu_forward, swiglu_backward},
    {add_forward, add_inplace, fill, add_scalar, axpy, mul_forward, mul_backward, copy_rows, dropout_forward, dropout_backward},
    {sum, dot, sq_diff_sum, sq_diff_backward},
    {rope_forward, rope_backward},
    {attention_forward, attention_backward, attention_ranged_forward, attention_ranged_backward, attention_block_forward,
     attention_block_backward},
    {crossentropy_forward, crossentropy_backward, softmax_forward, softmax_backward},
    {gather_rows, scatter_rows, gather_elems, scatter_elems, topk_forward, topk_backward},
    {grouped_gemm_forward, grouped_gemm_backward, sigmoid_forward, sigmoid_backward, normalize_rows_forward,
     normalize_rows_backward},
};

}  // namespace

void register_kernel_tables() { kernels::register_table(Device::Kind::cpu, DType::f32, &kCpuF32); }

}  // namespace atl::cpu
