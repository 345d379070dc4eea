// The dropout mask as a pure function of (key, element index), shared by every backend so that a
// given (seed, rank, step, site) drops the same elements on any device and for any thread count.
// A counter-based generator in the sense of Salmon et al. 2011 ("Parallel random numbers: as easy
// as 1, 2, 3"), here with splitmix64's finaliser (Steele et al. 2014) as the mixing function.
#pragma once
#include <cstdint>

namespace atl::kernels {

inline uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// One dropout call's key: seed, rank, step and call site (a layer's number) mixed in turn.
inline uint64_t dropout_key(uint64_t seed, uint64_t rank, uint64_t step, uint64_t site) {
  return splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ rank) ^ step) ^ site);
}

// p rounded to a multiple of 2^-24: element i is dropped when the hash's top 24 bits are below it.
inline uint32_t dropout_threshold(float p) { return uint32_t(double(p) * double(1u << 24)); }
inline bool dropout_dropped(uint64_t key, int64_t i, uint32_t threshold) {
  return uint32_t(splitmix64(key ^ splitmix64(uint64_t(i))) >> 40) < threshold;
}

}  // namespace atl::kernels
