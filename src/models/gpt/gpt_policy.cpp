// GPT as an RL policy (nn/policy_model.h): the trunk and the head of GPT::logits as two calls, and
// rollouts through the KV-cached batched generation of generate.cpp.
#include "models/gpt/generate.h"
#include "models/gpt/gpt.h"

namespace atl::nn {

Tensor GPT::features(const Tensor& tokens) const { return hidden(tokens); }
Tensor GPT::head(const Tensor& f) const { return ops::linear_t(f, head_weight()->value); }
int64_t GPT::feature_dim() const { return c_.n_embd; }

std::vector<PolicyModel::Completion> GPT::generate_batch(const std::vector<std::vector<int32_t>>& prompts,
                                                         int64_t max_new_tokens, const SamplingConfig& s) const {
  GenerateOptions o;
  o.max_new_tokens = max_new_tokens;
  o.sampling = s;
  std::vector<Completion> out;
  for (Generation& g : nn::generate(*this, prompts, o)) out.push_back({std::move(g.tokens), g.stopped});
  return out;
}

}  // namespace atl::nn
