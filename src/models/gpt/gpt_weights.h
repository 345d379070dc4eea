// A GPT's configuration and weights from a safetensors file: atoll's own files (the atoll_model
// metadata holds the configuration) or a plain Hugging Face GPT-2 file, which carries no
// configuration, only tensors. For those the dimensions are read from the shapes (vocabulary and
// width from wte, context from wpe, depth from the h.N blocks, MLP width from c_fc); the head count
// is not in any shape, so it comes from the caller or GPT-2's rule of 64-wide heads.
//
// Hugging Face GPT-2 names come with or without the "transformer." prefix (GPT2LMHeadModel vs
// GPT2Model), may include the attention mask buffers (h.N.attn.bias, h.N.attn.masked_bias), which
// are not weights, and an explicit tied lm_head; the Conv1D [in, out] layout is atoll's own.
#pragma once
#include "models/gpt/gpt_config.h"
#include "tensor/safetensors.h"

namespace atl::nn {

struct GptWeights {
  GPTConfig config;
  std::vector<std::pair<std::string, Tensor>> tensors;  // atoll's names, ready for load_state_dict
  bool from_hf = false;  // the configuration was inferred from a plain Hugging Face file
};

// n_head: heads for a Hugging Face file (0: n_embd / 64); ignored for atoll files.
GptWeights gpt_weights(TensorFile tf, const std::string& what, int64_t n_head = 0);

}  // namespace atl::nn
