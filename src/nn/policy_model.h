// What RL post-training needs of a model over token ids (src/rl, the "rl" task): the trunk's
// features and the head over them as separate steps (a value head reads the same features for
// PPO), and batched generation for rollouts. Families implement it beside their model (GPT:
// models/gpt/gpt_policy.cpp); nothing above nn names a family.
#pragma once
#include <cstdint>
#include <vector>

#include "nn/kv_cache.h"
#include "nn/sampling.h"
#include "tensor/tensor.h"

namespace atl::nn {

class PolicyModel {
 public:
  virtual ~PolicyModel() = default;
  // tokens [B,T] i32 -> final hidden states [B,T,C] after the final norm (records when grad is on).
  virtual Tensor features(const Tensor& tokens) const = 0;
  // features [..., C] -> logits [..., V]. logits(tokens) == head(features(tokens)) bit for bit.
  virtual Tensor head(const Tensor& features) const = 0;
  virtual int64_t feature_dim() const = 0;
  // The new tokens of each prompt (without the prompt and the stop token), with whether the row
  // ended on a stop token. Row b samples from Rng(s.seed, b). Records nothing.
  struct Completion {
    std::vector<int32_t> tokens;
    bool stopped = false;
  };
  virtual std::vector<Completion> generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                 int64_t max_new_tokens, const SamplingConfig& s) const = 0;
  // Incremental decoding one step at a time (rl/belayer.h rebuilds a request's cache from its
  // logged prefix): a cache for `batch` rows of up to `capacity` positions, and the cached forward
  // over new tokens [B,T] (row b's first n_new[b] real) -> logits [B,V] at each row's last one.
  virtual KVCache make_kv_cache(int64_t batch, int64_t capacity) const = 0;
  virtual Tensor forward_cached(const Tensor& tokens, KVCache& cache, const std::vector<int64_t>& n_new) const = 0;
};

}  // namespace atl::nn
