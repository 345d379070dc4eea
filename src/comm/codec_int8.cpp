// Block-scaled int8: each block of 32 values shares an f32 scale s = max|x| / 127 and every value
// becomes round(x / s) in [-127, 127] (the symmetric range, so that 0 is exact and -x encodes as
// the negation of x). The error of a value is at most s / 2 = block max / 127 / 2.
#include <cmath>
#include <cstring>
#include <limits>

#include "comm/codec.h"

namespace atl::comm {

namespace {

constexpr int64_t kBlock = 32;

class Int8Codec final : public Codec {
 public:
  std::string name() const override { return "int8"; }
  int64_t encoded_bytes(int64_t n) const override { return n + 4 * ((n + kBlock - 1) / kBlock); }
  void encode(const float* x, int64_t n, uint8_t* out, const RoundingRng* rng) const override {
    check_finite(x, n);
    const int64_t nb = (n + kBlock - 1) / kBlock;
    int8_t* q = reinterpret_cast<int8_t*>(out + 4 * nb);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
      float amax = 0.f;
      for (int64_t i = lo; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
      float s = amax == 0.f ? 0.f : std::max(amax / 127.f, std::numeric_limits<float>::min());
      while (!std::isfinite(s * 127.f)) s = std::nextafter(s, 0.f);  // near FLT_MAX: decodes stay finite
      std::memcpy(out + 4 * b, &s, 4);
      for (int64_t i = lo; i < hi; ++i) {
        if (s == 0.f) {
          q[i] = 0;
          continue;
        }
        float y = x[i] / s;
        float r = rng ? std::floor(y + rng->uniform(uint64_t(i))) : std::nearbyint(y);
        q[i] = int8_t(std::clamp(r, -127.f, 127.f));
      }
    }
  }
  void decode(const uint8_t* in, int64_t n, float* out) const override {
    const int64_t nb = (n + kBlock - 1) / kBlock;
    const int8_t* q = reinterpret_cast<const int8_t*>(in + 4 * nb);
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t b = 0; b < nb; ++b) {
      float s;
      std::memcpy(&s, in + 4 * b, 4);
      for (int64_t i = b * kBlock, hi = std::min(n, i + kBlock); i < hi; ++i) out[i] = float(q[i]) * s;
    }
  }
};

CodecRegistrar reg("int8", {[] { return std::make_unique<Int8Codec>(); }, "", ""});

}  // namespace
}  // namespace atl::comm
