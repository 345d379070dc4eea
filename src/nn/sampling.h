// Choosing the next token from a row of logits: greedy (temperature 0) or sampling from
// softmax(logits / temperature), optionally restricted to the k most likely tokens (top-k, Fan et
// al. 2018) and then to the smallest set of them whose probability reaches p (nucleus sampling,
// Holtzman et al. 2020). Stop tokens end a row's generation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/rng.h"

namespace atl::nn {

struct SamplingConfig {
  float temperature = 1.0f;  // 0: greedy (argmax, lowest id on ties)
  int64_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // in (0, 1]; 1: no limit
  std::vector<int32_t> stop_tokens;
  uint64_t seed = 42;  // row b of a batch draws from Rng(seed, b), so a row's tokens do not depend on its batch

  // Throws naming the setting and the accepted range; `prefix` names settings the way the caller's
  // user set them ("--" for flags, "sample." for config keys).
  void validate(const std::string& prefix = "") const;
  bool is_stop(int32_t t) const;
};

// Picks a token from logits[0..V). Greedy draws nothing from rng; sampling draws one uniform.
int32_t sample_token(const float* logits, int64_t V, const SamplingConfig& s, Rng& rng);

}  // namespace atl::nn
