// Dropout (Srivastava et al. 2014), inverted: kept elements are scaled by 1/(1-p). The mask is a
// stateless hash of (key, element index) (kernels/dropout_mask.h), so backward recomputes it
// instead of storing it, and the result does not depend on how the loop is split across threads.
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"
#include "kernels/dropout_mask.h"

namespace atl::cpu {

void dropout_forward(float* out, const float* x, int64_t n, float p, uint64_t key) {
  const uint32_t th = kernels::dropout_threshold(p);
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) out[i] = kernels::dropout_dropped(key, i, th) ? 0.0f : x[i] * scale;
}

void dropout_backward(float* dx, const float* dout, int64_t n, float p, uint64_t key) {
  const uint32_t th = kernels::dropout_threshold(p);
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if(parallel : n >= detail::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i)
    if (!kernels::dropout_dropped(key, i, th)) dx[i] += dout[i] * scale;
}

}  // namespace atl::cpu
