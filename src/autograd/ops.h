// Differentiable ops: each runs its fused forward kernel now and records a node whose backward
// calls the matching backward kernel (kernels/cpu/kernels.h). Inputs must be contiguous f32
// (token ids i32). Shapes: activations [..., C] are treated as [N, C] rows.
#pragma once
#include "autograd/graph.h"

namespace atl::ops {

// tokens [B,T] i32 -> [B,T,C]; wpe may be undefined (no learned positions).
Tensor embedding(const Tensor& tokens, const Tensor& wte, const Tensor& wpe);
// x [..., C] · w [C, OC] + b [OC] (b may be undefined) -> [..., OC]
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);
Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps = 1e-5f);
Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps = 1e-5f);
Tensor gelu(const Tensor& x);
// x [..., 2F] = [gate | up] -> [..., F]
Tensor swiglu(const Tensor& x);
Tensor add(const Tensor& a, const Tensor& b);
// qkv [B,T,(H+2KV)*hd] -> same shape, q and k rotated
Tensor rope(const Tensor& qkv, int64_t H, int64_t KV, int64_t hd, float theta, int64_t pos_offset = 0);
// qkv [B,T,(H+2KV)*hd] -> [B,T,H*hd], causal
Tensor attention(const Tensor& qkv, int64_t H, int64_t KV, int64_t hd);
// logits [N,V], targets [N] i32 (negative = ignored) -> scalar mean loss over the kept targets.
// With reuse_logits, backward writes dlogits into the logits' own storage (saves N*V floats);
// only valid when nothing else reads the logits after this op.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, bool reuse_logits = false);
// Sum of all elements -> scalar (used by tests and gradient checks).
Tensor sum(const Tensor& x);
// Elementwise product with a constant tensor that takes no gradient (used by gradient checks).
Tensor dot_const(const Tensor& x, const Tensor& c);

}  // namespace atl::ops

namespace atl::ops {
// x [..., C] · w^T with w [OC, C] (nn.Linear layout: the tied or untied LM head) -> [..., OC]
Tensor linear_t(const Tensor& x, const Tensor& w);
}  // namespace atl::ops
