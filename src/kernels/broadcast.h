// NumPy broadcasting of two shapes, reduced to what a kernel needs: the output's sizes with
// adjacent dimensions of the same broadcast pattern merged (so [B,T,C]·[C] is a 2-d problem),
// and each operand's element strides over them (0 where it is broadcast). Device-neutral.
#pragma once
#include <cstdint>
#include <vector>

namespace atl::kernels {

constexpr int kMaxBroadcastDims = 8;

struct Broadcast {
  int ndim = 0;
  int64_t size[kMaxBroadcastDims] = {};
  int64_t sa[kMaxBroadcastDims] = {};  // a's strides (0: broadcast)
  int64_t sb[kMaxBroadcastDims] = {};
  int64_t numel = 1;
};

// The broadcast shape of a and b, or false when they do not broadcast (a dim pair differs and
// neither is 1) or need more than kMaxBroadcastDims merged dims.
bool broadcast_shapes(const std::vector<int64_t>& a, const std::vector<int64_t>& b, std::vector<int64_t>* out,
                      Broadcast* plan);

}  // namespace atl::kernels
