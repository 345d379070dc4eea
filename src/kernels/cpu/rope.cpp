// Rotary position embedding (Su et al. 2021, RoFormer) in the rotate-half layout of Hugging Face
// Llama: dimension i pairs with i + hd/2, frequency theta^(-2i/hd). Applied to the q and k heads
// of a packed qkv buffer; v passes through. The cos/sin table is computed in double once per
// (T, hd, theta, offset) and cached per calling thread, so steady-state calls do no trig.
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/kernel_util.h"
#include "kernels/cpu/kernels.h"

namespace atl::cpu {

namespace {

struct RopeTable {
  int64_t T = -1, hd = -1, offset = 0;
  float theta = 0.0f;
  std::vector<float> cos, sin;  // [T, hd/2]
};

const RopeTable& rope_table(int64_t T, int64_t hd, float theta, int64_t offset) {
  thread_local RopeTable tab;
  if (tab.T == T && tab.hd == hd && tab.theta == theta && tab.offset == offset) return tab;
  const int64_t half = hd / 2;
  tab.cos.resize(size_t(T * half));
  tab.sin.resize(size_t(T * half));
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(double(theta), -2.0 * double(i) / double(hd));
    for (int64_t t = 0; t < T; ++t) {
      const double a = double(t + offset) * inv_freq;
      tab.cos[size_t(t * half + i)] = float(std::cos(a));
      tab.sin[size_t(t * half + i)] = float(std::sin(a));
    }
  }
  tab.T = T, tab.hd = hd, tab.theta = theta, tab.offset = offset;
  return tab;
}

// sign = +1 rotates by +angle (forward), -1 by -angle (the transpose, for backward).
template <bool Accumulate>
void rope_apply(float* out, const float* inp, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                float theta, int64_t pos_offset, float sign) {
  ATOLL_CHECK(hd % 2 == 0, "rope: head dim {} must be even", hd);
  ATOLL_CHECK(H % KV == 0 && KV > 0, "rope: {} query heads are not a multiple of {} kv heads", H, KV);
  const RopeTable& tab = rope_table(T, hd, theta, pos_offset);
  const float* ctab = tab.cos.data();
  const float* stab = tab.sin.data();
  const int64_t half = hd / 2, row = (H + 2 * KV) * hd, rotated = (H + KV) * hd;
#pragma omp parallel for schedule(static) if(parallel : B * T * row >= detail::kMinParallelWork)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T;
    const float* c = ctab + t * half;
    const float* s = stab + t * half;
    const float* x = inp + bt * row;
    float* y = out + bt * row;
    for (int64_t h = 0; h < H + KV; ++h) {
      const float* xa = x + h * hd;
      const float* xb = xa + half;
      float* ya = y + h * hd;
      float* yb = ya + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float a = xa[i], b = xb[i], sn = sign * s[i];
        const float ra = a * c[i] - b * sn, rb = b * c[i] + a * sn;
        if constexpr (Accumulate) {
          ya[i] += ra;
          yb[i] += rb;
        } else {
          ya[i] = ra;
          yb[i] = rb;
        }
      }
    }
#pragma omp simd
    for (int64_t i = rotated; i < row; ++i) {
      if constexpr (Accumulate) y[i] += x[i];
      else y[i] = x[i];
    }
  }
}

}  // namespace

void rope_forward(float* out, const float* inp, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                  float theta, int64_t pos_offset) {
  rope_apply<false>(out, inp, B, T, H, KV, hd, theta, pos_offset, 1.0f);
}

void rope_backward(float* dinp, const float* dout, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd,
                   float theta, int64_t pos_offset) {
  // The rotation is orthogonal, so its vector-Jacobian product is the rotation by -angle.
  rope_apply<true>(dinp, dout, B, T, H, KV, hd, theta, pos_offset, -1.0f);
}

}  // namespace atl::cpu
