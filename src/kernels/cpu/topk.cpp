// Top-k of each row: the k largest values in descending order with their indices (ties go to the
// lower index, NaN counts as the largest, as in torch.topk). Backward routes each value's gradient
// to the position it came from; rows are independent, so both parallelise over rows.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/op_set.h"

namespace atl::cpu {

void topk_forward(float* values, int32_t* indices, const float* x, int64_t N, int64_t C, int64_t k) {
#pragma omp parallel if(parallel : N * C >= detail::kMinParallelWork)
  {
    int32_t* order = detail::scratch<int32_t>(size_t(C));
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const float* xi = x + i * C;
      std::iota(order, order + C, 0);
      auto before = [xi](int32_t a, int32_t b) {
        const float va = xi[a], vb = xi[b];
        const bool na = std::isnan(va), nb = std::isnan(vb);
        if (na != nb) return na;
        if (!na && va != vb) return va > vb;
        return a < b;
      };
      std::partial_sort(order, order + k, order + C, before);
      for (int64_t j = 0; j < k; ++j) {
        indices[i * k + j] = order[j];
        values[i * k + j] = xi[order[j]];
      }
    }
  }
}

void topk_backward(float* dx, const float* dvalues, const int32_t* indices, int64_t N, int64_t C, int64_t k) {
#pragma omp parallel for schedule(static) if(parallel : N * k >= detail::kMinParallelWork)
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < k; ++j) dx[i * C + indices[i * k + j]] += dvalues[i * k + j];
}

}  // namespace atl::cpu
