// NVFP4 (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", 2025, and
// the NVFP4 pretraining recipe, "Pretraining Large Language Models with NVFP4", 2025): 4-bit E2M1
// values (±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) in blocks of 16, each block with an FP8 E4M3 scale, and
// one f32 scale per tensor that brings the block scales into E4M3's range:
//   s_t = max|x| / (6 * 448),  s_b = E4M3(max_block|x| / (6 s_t)),  q = E2M1(x / (s_b s_t)).
// Bytes: 4 + n/16 + n/2 for n values, 7.1x fewer than f32.
//
// Block scales round UP to the next E4M3 value, so that every scaled value is within ±6 and
// stochastic rounding (floor(q + u) on the grid) is unbiased: a scale rounded down would push the
// block maximum past 6, where saturation biases it. With nearest rounding the error of a value is
// at most max(|x| / 4, S / 4), S = s_b s_t its block's effective scale (half E2M1's spacing 0.5 at
// the bottom, a quarter of the value above 1).
#include <cmath>
#include <cstring>
#include <limits>

#include "comm/codec.h"

namespace atl::comm {

namespace {

constexpr int64_t kBlock = 16;

// |y| <= 6 onto E2M1's magnitudes; u < 0: nearest-even, else stochastic. Returns the 3-bit code.
uint8_t e2m1(float a, float u) {
  if (a == 0.f) return 0;
  int E;
  std::frexp(a, &E);
  int e = std::max(E - 1, 0);
  float step = std::ldexp(1.f, e - 1);
  float q = a / step;
  float r = u < 0.f ? std::nearbyint(q) : std::floor(q + u);
  float v = std::min(r * step, 6.f);
  // v * 2 is one of 0 1 2 3 4 6 8 12
  static const uint8_t code[13] = {0, 1, 2, 3, 4, 0, 5, 0, 6, 0, 0, 0, 7};
  return code[int(v * 2.f)];
}
const float kE2M1[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};

class Nvfp4Codec final : public Codec {
 public:
  std::string name() const override { return "nvfp4"; }
  int64_t encoded_bytes(int64_t n) const override { return 4 + (n + kBlock - 1) / kBlock + (n + 1) / 2; }
  void encode(const float* x, int64_t n, uint8_t* out, const RoundingRng* rng) const override {
    check_finite(x, n);
    const int64_t nb = (n + kBlock - 1) / kBlock;
    float amax = 0.f;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    float st = amax == 0.f ? 0.f : std::max(amax / (6.f * fp8::kE4M3Max), std::numeric_limits<float>::min());
    while (!std::isfinite(st * 6.f * fp8::kE4M3Max)) st = std::nextafter(st, 0.f);  // decodes stay finite
    std::memcpy(out, &st, 4);
    uint8_t* sb = out + 4;
    uint8_t* q = sb + nb;
    std::memset(q, 0, size_t((n + 1) / 2));
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
      float bmax = 0.f;
      for (int64_t i = lo; i < hi; ++i) bmax = std::max(bmax, std::fabs(x[i]));
      sb[b] = bmax == 0.f ? 0 : fp8::encode_e4m3_up(bmax / (6.f * st));
      const float S = fp8::decode_e4m3(sb[b]) * st;
      for (int64_t i = lo; i < hi; ++i) {  // blocks hold an even count: a byte never spans two
        uint8_t c = S == 0.f ? 0 : e2m1(std::fabs(x[i]) / S, rng ? rng->uniform(uint64_t(i)) : -1.f);
        if (c && std::signbit(x[i])) c |= 8;
        q[i / 2] |= uint8_t(i % 2 ? c << 4 : c);
      }
    }
  }
  void decode(const uint8_t* in, int64_t n, float* out) const override {
    const int64_t nb = (n + kBlock - 1) / kBlock;
    float st;
    std::memcpy(&st, in, 4);
    const uint8_t* sb = in + 4;
    const uint8_t* q = sb + nb;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < nb; ++b) {
      const float S = fp8::decode_e4m3(sb[b]) * st;
      for (int64_t i = b * kBlock, hi = std::min(n, i + kBlock); i < hi; ++i) {
        uint8_t c = (q[i / 2] >> (i % 2 ? 4 : 0)) & 15;
        float v = kE2M1[c & 7] * S;
        out[i] = c & 8 ? -v : v;
      }
    }
  }
};

CodecRegistrar reg("nvfp4", {[] { return std::make_unique<Nvfp4Codec>(); }, "", ""});

}  // namespace
}  // namespace atl::comm
