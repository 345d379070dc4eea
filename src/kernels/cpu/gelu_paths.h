// GELU's two compiled variants (gelu_body.inc), callable directly so that tests and benchmarks
// cover both: gelu_avx2 (generic code, 8 lanes; gelu.cpp) and gelu_avx512 (16 lanes; the CPU must
// have AVX-512; gelu_avx512.cpp). The kernels.h / gelu_bf16.h entry points take the AVX-512 one
// from the avx512 path up (isa.h), unless ATOLL_GELU_PATH=avx2 keeps the generic one (for
// comparisons; read once). Both give the same bits on every element.
#pragma once
#include <cstdint>

#include "tensor/dtype.h"

#define ATOLL_GELU_DECLS                                                                                      \
  void forward(float* out, const float* inp, int64_t n);                                                     \
  void backward(float* dinp, const float* dout, const float* inp, int64_t n);                                \
  void forward_keep_bf16(float* out, bf16* saved, const float* inp, int64_t n);                              \
  void forward_keep_bf16(float* out, bf16* out_bf16, bf16* saved, const float* inp, int64_t n);              \
  void backward_bf16_rows(float* dinp, bf16* dinp_bf16, float* partials, const float* dout, const bf16* inp, \
                          int64_t N, int64_t OC);                                                            \
  void backward_bf16(float* dinp, const float* dout, const bf16* inp, int64_t n, bool accumulate);

namespace atl::cpu::gelu_avx2 {
ATOLL_GELU_DECLS
}
namespace atl::cpu::gelu_avx512 {
ATOLL_GELU_DECLS
}
#undef ATOLL_GELU_DECLS

namespace atl::cpu::detail {
// Whether the entry points run gelu_avx512 now (active_isa() >= avx512 and no ATOLL_GELU_PATH=avx2).
bool gelu_avx512_active();
}  // namespace atl::cpu::detail
