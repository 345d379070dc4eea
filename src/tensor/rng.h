// Seeded random numbers with independent streams: Rng(seed, stream) for stream = rank gives each
// rank its own sequence, and the whole state is four words that a checkpoint saves and restores.
// Generator: xoshiro256** (Blackman & Vigna), seeded through splitmix64.
#pragma once
#include <array>
#include <cstdint>

#include "tensor/tensor.h"

namespace atl {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t stream = 0);
  uint64_t next_u64();
  uint32_t next_u32() { return uint32_t(next_u64() >> 32); }
  float uniform();  // [0, 1)
  float normal();   // standard normal (Box–Muller, one value per call, the pair cached)
  uint64_t below(uint64_t n);  // uniform integer in [0, n)

  void fill_normal(Tensor& t, float mean, float std);
  void fill_uniform(Tensor& t, float lo, float hi);

  using State = std::array<uint64_t, 6>;  // 4 words, cached normal flag and value
  State state() const;
  void set_state(const State& s);

 private:
  uint64_t s_[4];
  bool has_spare_ = false;
  float spare_ = 0.f;
};

}  // namespace atl
