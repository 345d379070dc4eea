// FP8 with per-block f32 scales, in the two OCP 8-bit formats (Micikevicius et al., "FP8 Formats
// for Deep Learning", 2022): E4M3 (bias 7, no infinities, largest 448) and E5M2 (bias 15, largest
// finite 57344). Each block of 32 values is scaled so that its largest magnitude lands on the
// format's largest value, then rounded per element (nearest-even, or stochastically). A block's
// relative error is then at most 2^-4 (E4M3) / 2^-3 (E5M2) in the normal range, and half the
// smallest subnormal step (times the scale) below it.
#include <cmath>
#include <cstring>
#include <limits>

#include "comm/codec.h"

namespace atl::comm {

namespace {

struct Format {
  int m, bias, emin;  // mantissa bits, exponent bias, exponent of the smallest normal
  float max;
};
constexpr Format kE4M3{3, 7, -6, fp8::kE4M3Max}, kE5M2{2, 15, -14, fp8::kE5M2Max};

// Rounds |x| onto the format's grid; u < 0: nearest-even, else floor(q + u) (stochastic).
float round_to(const Format& f, float a, float u) {
  if (a == 0.f) return 0.f;
  int E;
  std::frexp(a, &E);  // a = frac * 2^E, frac in [0.5, 1)
  int e = std::max(E - 1, f.emin);
  float step = std::ldexp(1.f, e - f.m);
  float q = a / step;  // exact: a power-of-two scale
  float r = u < 0.f ? std::nearbyint(q) : std::floor(q + u);
  float v = r * step;
  return v > f.max ? f.max : v;
}

uint8_t code_of(const Format& f, float x, float u) {
  uint8_t s = std::signbit(x) ? 0x80 : 0;
  float v = round_to(f, std::fabs(x), u);
  if (v == 0.f) return s;
  int E;
  std::frexp(v, &E);
  int e = E - 1;
  uint32_t exp_field, mant;
  if (e < f.emin) {  // subnormal
    exp_field = 0;
    mant = uint32_t(std::ldexp(v, f.m - f.emin));
  } else {
    exp_field = uint32_t(e + f.bias);
    mant = uint32_t(std::ldexp(v, f.m - e)) - (1u << f.m);
  }
  return uint8_t(s | (exp_field << f.m) | mant);
}

float value_of(const Format& f, uint8_t c) {
  int E = (c & 0x7f) >> f.m, M = c & ((1 << f.m) - 1);
  float v = E == 0 ? std::ldexp(float(M), f.emin - f.m) : std::ldexp(1.f + float(M) / float(1 << f.m), E - f.bias);
  if (&f == &kE4M3 && E == 15 && M == 7) v = std::numeric_limits<float>::quiet_NaN();  // never encoded
  if (&f == &kE5M2 && E == 31) v = M ? std::numeric_limits<float>::quiet_NaN() : INFINITY;  // never encoded
  return (c & 0x80) ? -v : v;
}

struct Lut {
  float v[256];
  explicit Lut(const Format& f) {
    for (int c = 0; c < 256; ++c) v[c] = value_of(f, uint8_t(c));
  }
};
const Lut& lut(const Format& f) {
  static const Lut e4(kE4M3), e5(kE5M2);
  return &f == &kE4M3 ? e4 : e5;
}

constexpr int64_t kBlock = 32;

class Fp8Codec final : public Codec {
 public:
  explicit Fp8Codec(bool e4m3) : f_(e4m3 ? kE4M3 : kE5M2), name_(e4m3 ? "fp8_e4m3" : "fp8_e5m2") {}
  std::string name() const override { return name_; }
  int64_t encoded_bytes(int64_t n) const override { return n + 4 * ((n + kBlock - 1) / kBlock); }
  void encode(const float* x, int64_t n, uint8_t* out, const RoundingRng* rng) const override {
    check_finite(x, n);
    const int64_t nb = (n + kBlock - 1) / kBlock;
    float* scales = reinterpret_cast<float*>(out);  // scales first: 4-byte aligned when out is
    uint8_t* q = out + 4 * nb;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
      float amax = 0.f;
      for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
      // The scale stays a normal float, so x / s never overflows and tiny blocks keep their digits.
      float s = amax == 0.f ? 0.f : std::max(amax / f_.max, std::numeric_limits<float>::min());
      while (!std::isfinite(s * f_.max)) s = std::nextafter(s, 0.f);  // near FLT_MAX: decodes stay finite
      std::memcpy(&scales[b], &s, 4);
      for (int64_t i = lo; i < hi; ++i)
        q[i] = s == 0.f ? 0 : code_of(f_, x[i] / s, rng ? rng->uniform(uint64_t(i)) : -1.f);
    }
  }
  void decode(const uint8_t* in, int64_t n, float* out) const override {
    const int64_t nb = (n + kBlock - 1) / kBlock;
    const uint8_t* q = in + 4 * nb;
    const float* v = lut(f_).v;
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < nb; ++b) {
      float s;
      std::memcpy(&s, in + 4 * b, 4);
      for (int64_t i = b * kBlock, hi = std::min(n, i + kBlock); i < hi; ++i) out[i] = v[q[i]] * s;
    }
  }

 private:
  const Format& f_;
  std::string name_;
};

CodecRegistrar r1("fp8_e4m3", {[] { return std::make_unique<Fp8Codec>(true); }, "", ""});
CodecRegistrar r2("fp8_e5m2", {[] { return std::make_unique<Fp8Codec>(false); }, "", ""});

}  // namespace

namespace fp8 {
uint8_t encode_e4m3(float x, float u) { return code_of(kE4M3, x, u); }
uint8_t encode_e5m2(float x, float u) { return code_of(kE5M2, x, u); }
float decode_e4m3(uint8_t c) { return lut(kE4M3).v[c]; }
float decode_e5m2(uint8_t c) { return lut(kE5M2).v[c]; }
uint8_t encode_e4m3_up(float x) {
  uint8_t c = code_of(kE4M3, x, -1.f);
  if (decode_e4m3(c) < x && (c & 0x7f) < 0x7e) ++c;  // the next code up (same sign, x >= 0)
  return c;
}
}  // namespace fp8

}  // namespace atl::comm
