// GELU with the tanh approximation used by GPT-2 (Hendrycks & Gimpel 2016):
// gelu(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). tanh comes from a vectorisable
// exp (kernel_util.h) because libm's tanhf would keep these loops scalar. The loops live in
// gelu_body.inc, compiled here as generic code (8 lanes) and in gelu_avx512.cpp for AVX-512 (16
// lanes, same bits); the entry points below pick one by the active path (gelu_paths.h).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "kernels/cpu/gelu_bf16.h"
#include "kernels/cpu/gelu_paths.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu::gelu_avx2 {
#include "kernels/cpu/gelu_body.inc"
}  // namespace atl::cpu::gelu_avx2

namespace atl::cpu {

namespace detail {
bool gelu_avx512_active() {
  static const bool keep_avx2 = [] {
    const char* v = std::getenv("ATOLL_GELU_PATH");
    return v && std::string_view(v) == "avx2";
  }();
  return !keep_avx2 && active_isa() >= Isa::avx512;
}
}  // namespace detail

void gelu_forward(float* out, const float* inp, int64_t n) {
  if (detail::gelu_avx512_active()) return gelu_avx512::forward(out, inp, n);
  gelu_avx2::forward(out, inp, n);
}

void gelu_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  if (detail::gelu_avx512_active()) return gelu_avx512::backward(dinp, dout, inp, n);
  gelu_avx2::backward(dinp, dout, inp, n);
}

void gelu_forward_keep_bf16(float* out, bf16* saved, const float* inp, int64_t n) {
  if (detail::gelu_avx512_active()) return gelu_avx512::forward_keep_bf16(out, saved, inp, n);
  gelu_avx2::forward_keep_bf16(out, saved, inp, n);
}

void gelu_forward_keep_bf16(float* out, bf16* out_bf16, bf16* saved, const float* inp, int64_t n) {
  if (detail::gelu_avx512_active()) return gelu_avx512::forward_keep_bf16(out, out_bf16, saved, inp, n);
  gelu_avx2::forward_keep_bf16(out, out_bf16, saved, inp, n);
}

void gelu_backward_bf16_rows(float* dinp, bf16* dinp_bf16, float* partials, const float* dout, const bf16* inp,
                             int64_t N, int64_t OC) {
  if (detail::gelu_avx512_active()) return gelu_avx512::backward_bf16_rows(dinp, dinp_bf16, partials, dout, inp, N, OC);
  gelu_avx2::backward_bf16_rows(dinp, dinp_bf16, partials, dout, inp, N, OC);
}

void gelu_backward_bf16(float* dinp, const float* dout, const bf16* inp, int64_t n, bool accumulate) {
  if (detail::gelu_avx512_active()) return gelu_avx512::backward_bf16(dinp, dout, inp, n, accumulate);
  gelu_avx2::backward_bf16(dinp, dout, inp, n, accumulate);
}

}  // namespace atl::cpu
