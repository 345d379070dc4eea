// The tensor-parallel tests' synthetic global batch (test_tensor_parallel.cpp and
// test_tensor_parallel_optim.cpp): row r of step s is a mix of random tokens and a learnable
// recurrence, a function of (s, r) only, so every layout cuts the same global batch.
#pragma once

#include <cstdint>

#include "harness.h"
#include "tensor/tensor.h"

namespace atl::parallel::tp_batch {

// Rows [row0, row0 + rows) of step s's batch: inputs x and next-token targets y, [rows, T].
inline void rows(int s, int row0, int rows, int64_t V, int64_t T, Tensor& x, Tensor& y) {
  x = Tensor::empty({rows, T}, DType::i32);
  y = Tensor::empty({rows, T}, DType::i32);
  for (int r = 0; r < rows; ++r) {
    int32_t prev = int32_t(test::mix(uint64_t(s) * 7919 + uint64_t(row0 + r)) % uint64_t(V));
    for (int64_t t = 0; t <= T; ++t) {
      uint64_t h = test::mix((uint64_t(s) << 40) ^ (uint64_t(row0 + r) << 12) ^ uint64_t(t));
      int32_t tok = h % 4 == 0 ? int32_t(h % uint64_t(V)) : int32_t((prev * 5 + 3) % V);
      if (t < T) x.i32()[r * T + t] = tok;
      if (t > 0) y.i32()[r * T + t - 1] = tok;
      prev = tok;
    }
  }
}

}  // namespace atl::parallel::tp_batch
