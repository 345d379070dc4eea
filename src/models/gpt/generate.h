// Autoregressive generation for a batch of prompts of any lengths, with a KV cache (the default)
// or by recomputing the whole context for every token (the reference the cache is tested and
// benchmarked against). Both paths see exactly the same contexts, so they pick the same tokens
// up to fp32 rounding of the logits.
//
// Context window: a row whose context would pass block_size keeps its last block_size/2 tokens
// and continues from there (the cache re-reads those once, instead of every token as a sliding
// window would); a prompt longer than block_size starts from its last block_size tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "models/gpt/gpt.h"
#include "nn/sampling.h"

namespace atl::nn {

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingConfig sampling;
  bool use_cache = true;
  // Called with each step's logits [B,V] before sampling (rows that have finished hold stale
  // values); tests compare the two paths with it.
  std::function<void(int64_t step, const Tensor& logits)> on_logits;
};

struct Generation {
  std::vector<int32_t> tokens;  // the new tokens, without the prompt and without the stop token
  bool stopped = false;         // ended on a stop token (else after max_new_tokens)
};

// One Generation per prompt; every prompt must hold at least one token.
std::vector<Generation> generate(const GPT& model, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& o);

}  // namespace atl::nn
