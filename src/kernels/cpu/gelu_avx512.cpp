// GELU's loops (gelu_body.inc) compiled for AVX-512 (16 lanes); gelu.cpp calls them from the avx512
// path up. Every header the body needs comes before the target pragma, so the shared inline helpers
// (kernel_util.h, <cmath>) keep the generic target wherever they are not inlined.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/gelu_bf16.h"
#include "kernels/cpu/gelu_paths.h"
#include "kernels/cpu/kernel_util.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,prefer-vector-width=512")
namespace atl::cpu::gelu_avx512 {
#include "kernels/cpu/gelu_body.inc"
}  // namespace atl::cpu::gelu_avx512
#pragma GCC pop_options
