// Activation recomputation ("gradient checkpointing": Chen et al. 2016, "Training Deep Nets with
// Sublinear Memory Cost"; selective recomputation of the attention core as in Korthikanti et al.
// 2022, "Reducing Activation Recomputation in Large Transformer Models"). checkpoint(x, f) runs
// f(x) without recording, so none of f's intermediate activations stay alive, and records one
// node that saves only x. Its backward reruns f(x) with recording onto a tape of its own and
// back-propagates the output's gradient through it: the same kernels in the same order as
// without recomputation, so the gradients are bit-identical (f must be deterministic: dropout's
// keyed masks, kernels/dropout_mask.h, are a function of their key and replay exactly).
//
// Leaf hooks (DDP's all-reduce) of parameters used inside f fire during the recomputed backward,
// when the node of their first use within f has run; a parameter used both inside and after f
// would fire early, so f must own its parameters (a transformer block does).
#pragma once
#include <functional>

#include "autograd/graph.h"

namespace atl {

Tensor checkpoint(const char* what, const Tensor& x, std::function<Tensor(const Tensor&)> f);

// What a block keeps for backward ([train] recompute): everything, all but the attention core,
// or only its input.
enum class Recompute { none, selective, full };
const char* recompute_name(Recompute r);
// "none", "selective" or "full"; throws naming `where` otherwise.
Recompute parse_recompute(const std::string& s, const std::string& where);

}  // namespace atl
