#include "tensor/rng.h"

#include <cmath>
#include <cstring>

namespace atl {
namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed, uint64_t stream) {
  // Mixing the stream through splitmix before combining keeps nearby (seed, stream) pairs apart.
  uint64_t x = seed;
  uint64_t y = stream * 0xd1342543de82ef95ull + 0x632be59bd9b4e019ull;
  x ^= splitmix64(y);
  for (auto& w : s_) w = splitmix64(x);
}

uint64_t Rng::next_u64() {
  uint64_t r = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return r;
}

float Rng::uniform() { return float(next_u64() >> 40) * (1.0f / 16777216.0f); }

uint64_t Rng::below(uint64_t n) {
  // Rejection keeps the distribution exactly uniform.
  uint64_t lim = UINT64_MAX - UINT64_MAX % n;
  uint64_t v;
  do v = next_u64(); while (v >= lim);
  return v % n;
}

float Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = (double(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
  double u2 = double(next_u64() >> 11) * (1.0 / 9007199254740992.0);
  double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = float(r * std::sin(2 * M_PI * u2));
  has_spare_ = true;
  return float(r * std::cos(2 * M_PI * u2));
}

void Rng::fill_normal(Tensor& t, float mean, float std) {
  ATOLL_CHECK(t.is_contiguous() && t.dtype() == DType::f32, "fill_normal needs a contiguous f32 tensor");
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = mean + std * normal();
}

void Rng::fill_uniform(Tensor& t, float lo, float hi) {
  ATOLL_CHECK(t.is_contiguous() && t.dtype() == DType::f32, "fill_uniform needs a contiguous f32 tensor");
  float* p = t.f32();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * uniform();
}

Rng::State Rng::state() const {
  State s{s_[0], s_[1], s_[2], s_[3], uint64_t(has_spare_), 0};
  std::memcpy(&s[5], &spare_, sizeof(float));
  return s;
}

void Rng::set_state(const State& s) {
  for (int i = 0; i < 4; ++i) s_[i] = s[i];
  has_spare_ = s[4] != 0;
  std::memcpy(&spare_, &s[5], sizeof(float));
}

}  // namespace atl
