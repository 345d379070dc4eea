// The attention kernels compiled once per ISA variant, chosen at run time by the active path
// (isa.h): each kernel file defines ATOLL_ATTN_BODY (its .inc body) and includes this file after
// every header the body needs, which compiles the body twice:
//   attn_avx2    generic code (the build's x86-64-v3), v8f tiles of 4×3 ymm;
//   attn_avx512  under `#pragma GCC target` (AVX-512 F/DQ/BW/VL, 512-bit vectorisation), v16f
//                tiles of 4×4 zmm; only called when active_isa() >= Isa::avx512.
// Everything either body defines lives in its own namespace, so no inline function is shared
// between code compiled for different targets (an ODR violation that could put AVX-512 code into
// generic callers); the shared helpers they call (kernel_util.h, the standard library) are
// declared before the pragma and so keep the generic target where they are not inlined.
//
// Rounding: tile products and element-wise loops give the same bits in both variants; dot_row's
// (the row kernels' q·k, dO·v and D = dO·O) splits into 8 or 16 lane partial sums, so the variants
// may differ there in the last bits (tests/kernels/test_attention_paths.cpp); the row kernels'
// softmax sums are kernel_util.h's exp_sum_seq, in index order in both.
//
// No include guard: included once per kernel file.
#ifndef ATOLL_ATTN_BODY
#error "define ATOLL_ATTN_BODY (the kernel body to compile per variant) before including this file"
#endif
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/attention_paths.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/kernel_util.h"

#pragma GCC diagnostic ignored "-Wpsabi"  // vectors by value: every use is inlined

namespace atl::cpu::attn_avx2 {
typedef float vec __attribute__((vector_size(32)));
constexpr int kLanes = 8;
constexpr int kTileVecs = 3;
#include "kernels/cpu/attention_tiles.h"
#include ATOLL_ATTN_BODY
}  // namespace atl::cpu::attn_avx2

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512bw,avx512vl,prefer-vector-width=512")
namespace atl::cpu::attn_avx512 {
typedef float vec __attribute__((vector_size(64)));
constexpr int kLanes = 16;
constexpr int kTileVecs = 4;
#include "kernels/cpu/attention_tiles.h"
#include ATOLL_ATTN_BODY
}  // namespace atl::cpu::attn_avx512
#pragma GCC pop_options

#undef ATOLL_ATTN_BODY

namespace atl::cpu::detail {
// The variant the active path runs: AVX-512 from the avx512 path up (avx512_bf16 and amx have it).
inline bool attention_avx512() { return active_isa() >= Isa::avx512; }
}  // namespace atl::cpu::detail
