// Dense matrix products on the CPU. Each entry point picks its path from the ISA detected at run
// time (kernels/cpu/isa.h): fp32 through OpenBLAS (cblas_sgemm) or oneDNN by a rule on the operand
// layout (gemm_f32_select.cpp); bf16 operands with fp32 accumulation through oneDNN (AMX tiles or
// AVX-512 BF16) or atoll's AVX-512 BF16 kernel (gemm_bf16_select.cpp), widened to fp32 on CPUs
// without bf16 instructions; int8 with
// exact int32 accumulation on AMX-INT8 / AVX-512 VNNI (oneDNN). The path-specific functions are
// callable directly so that tests cover every path a machine has.
// All matrices are row-major; ld* are row strides in elements.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace atl::cpu {

// C[M,N] = alpha * op(A) · op(B) + beta * C, op(X) = X or X^T.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The two fp32 libraries gemm chooses between, callable directly (tests, benchmarks).
void gemm_openblas(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// (gemm_onednn is declared below with the other oneDNN paths.)

// Which of them gemm uses: "auto" (the measured rule), "openblas" or "onednn" for every product.
// select_gemm_f32 applies a setting from `where` (hardware.gemm_f32; ATOLL_GEMM_F32, when set,
// takes precedence) and returns a one-line summary; an unknown name is an error naming `where`.
// gemm_f32_choice says which library gemm takes for a product under the current setting.
const std::vector<std::string>& gemm_f32_choices();
std::string select_gemm_f32(const std::string& name, const std::string& where);
void set_gemm_f32(const std::string& name);
const char* gemm_f32_setting();  // the current setting's name: "auto", "openblas" or "onednn"
const char* gemm_f32_choice(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K);

// The same over `batch` matrices at fixed element strides.
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c, int64_t batch);

// bf16 operands, fp32 accumulation and output.
// Which kernel the bf16 entry points (gemm_bf16, _bias, _batched) use where the CPU has AVX-512
// BF16: "auto" (oneDNN, the measured faster), "atoll" (atoll's kernel) or "onednn". Below AVX-512
// BF16 every setting widens to fp32, and select_gemm_bf16 refuses a forced one there (naming
// `where`; hardware.gemm_bf16, or ATOLL_GEMM_BF16, which takes precedence).
const std::vector<std::string>& gemm_bf16_choices();
std::string select_gemm_bf16(const std::string& name, const std::string& where);
void set_gemm_bf16(const std::string& name);
const char* gemm_bf16_setting();  // the current setting's name: "auto", "atoll" or "onednn"
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
               int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);

// C[M,N] = op(A) · op(B) + bias (bias[N] added to every row): oneDNN adds the bias in its
// epilogue, the other paths fill C with the bias and accumulate into it (one more pass).
void gemm_bf16_bias(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda,
                    const bf16* B, int64_t ldb, const float* bias, float* C, int64_t ldc);
void gemm_bf16_bias_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda,
                           const bf16* B, int64_t ldb, const float* bias, float* C, int64_t ldc);

// The same over `batch` matrices at fixed element strides (sa, sb, sc): one oneDNN batched
// matmul, or atoll's AVX-512 BF16 kernel (or the widened product) per matrix with the matrices
// spread over the threads. The _onednn form is callable
// directly, and onednn_matmul_impl names the kernel oneDNN picks for a dense bf16 product.
void gemm_bf16_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                       int64_t lda, int64_t sa, const bf16* B, int64_t ldb, int64_t sb, float beta, float* C,
                       int64_t ldc, int64_t sc, int64_t batch);
void gemm_bf16_batched_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                              const bf16* A, int64_t lda, int64_t sa, const bf16* B, int64_t ldb, int64_t sb,
                              float beta, float* C, int64_t ldc, int64_t sc, int64_t batch);
std::string onednn_matmul_impl(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t batch);

// The path gemm_bf16 takes on CPUs without AVX-512 BF16 (widen to fp32, then sgemm); callable
// directly so that tests cover it on any machine.
void gemm_bf16_portable(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
                        int64_t ldc);

// The AVX-512 BF16 kernel (the CPU must have it) and oneDNN's matmul (AMX where present).
void gemm_bf16_avx512(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                      int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm_bf16_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                      int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);
// atoll's own AMX-BF16 tile kernel (the CPU and OS must allow AMX).
void gemm_bf16_amx(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                   int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc);
// fp32 through oneDNN's matmul (the alternative to OpenBLAS that `atoll bench gemm` measures).
void gemm_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// C[M,N] = op(A) · op(B) over int8 with exact int32 accumulation (no overflow while
// K * 127 * 128 < 2^31, i.e. K < 131072). gemm_s8 takes oneDNN (AMX-INT8 or VNNI kernels) where
// the CPU has either and the plain loops otherwise.
void gemm_s8(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda,
             const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc);
void gemm_s8_onednn(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda,
                    const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc);
void gemm_s8_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t lda,
                       const int8_t* B, int64_t ldb, int32_t* C, int64_t ldc);

// The path each entry point takes under the active ISA and settings: gemm_bf16_path is
// "onednn-amx", "onednn-avx512_bf16", "avx512_bf16" (atoll's kernel) or "portable" (widened).
const char* gemm_path();
const char* gemm_bf16_path();
const char* gemm_s8_path();
std::string onednn_version();

bool has_avx512_bf16();
void f32_to_bf16(const float* in, bf16* out, int64_t n);
// Rows per block of a bias gradient's column sums: linear_bf16's dY pass sums each block of this
// many rows (in row order, from 0) into its own partials and adds the partials in block order;
// producers that hand over dY (gelu_bf16.h, attention_bf16.h) make the same partials.
constexpr int64_t kBiasSumRows = 64;
void bf16_to_f32(const bf16* in, float* out, int64_t n);

}  // namespace atl::cpu
