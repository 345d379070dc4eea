// [train] recompute: which activations each transformer block keeps for backward.
//   recompute = "none"        every block keeps everything (the default)
//             = "selective"   every block recomputes its attention core (Korthikanti et al. 2022)
//             = "full"        every block keeps only its input and reruns its forward in backward
//             = "full,full,none,selective"   one entry per block, bottom up
// The trade is memory for time: full costs one more forward per block, selective one more
// attention core; the gradients are bit-identical (autograd/checkpoint.h).
#pragma once
#include "core/config.h"
#include "nn/model.h"

namespace atl::nn {

// Parses the key for a model of `blocks` blocks; throws naming the key and its line.
std::vector<Recompute> recompute_from_config(Config& cfg, size_t blocks, const std::string& key = "train.recompute");
// Reads the key and applies it to the model (nothing when the key is absent).
void apply_recompute_config(Config& cfg, Model& model, const std::string& key = "train.recompute");

}  // namespace atl::nn
