// What every fuzz target shares. A target feeds one input to a parser of outside input and
// accepts exactly one outcome besides success: an atl::Error (a refusal with a message). Any
// other exception escapes and is a finding, like a crash, a hang or a sanitizer report; so is a
// broken invariant, reported through ATOLL_FUZZ_ASSERT (abort with the condition).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define ATOLL_FUZZ_ASSERT(cond)                                                        \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                    \
    }                                                                                  \
  } while (0)
