// Batched matrix product C_i = A_i · B_i (row-major [M,K]·[K,N] per batch entry) and its
// backward dA_i += dC_i · B_iᵀ, dB_i += A_iᵀ · dC_i, as strided sgemm calls (gemm.h).
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/op_set.h"

namespace atl::cpu {

void bmm_forward(float* c, const float* a, const float* b, int64_t batch, int64_t M, int64_t K, int64_t N) {
  gemm_batched(false, false, M, N, K, 1.0f, a, K, M * K, b, N, K * N, 0.0f, c, N, M * N, batch);
}

void bmm_backward(float* da, float* db, const float* dc, const float* a, const float* b, int64_t batch, int64_t M,
                  int64_t K, int64_t N) {
  if (da) gemm_batched(false, true, M, K, N, 1.0f, dc, N, M * N, b, N, K * N, 1.0f, da, K, M * K, batch);
  if (db) gemm_batched(true, false, K, N, M, 1.0f, a, K, M * K, dc, N, M * N, 1.0f, db, N, K * N, batch);
}

}  // namespace atl::cpu
