// Differentiable ops: each runs its fused forward kernel now and records a node whose backward
// calls the matching backward kernel. Kernels are reached through the dispatch table of the
// inputs' (device, dtype) (kernels/dispatch.h), never named here. Inputs must be contiguous f32
// on one device (token ids and indices i32). Shapes: activations [..., C] are treated as [N, C] rows.
#pragma once
#include <vector>

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
// cross_entropy(linear_t(x, w), targets, reuse_logits = true) as one op: in bf16 mode the logits
// are made and consumed in row blocks and only their bf16 gradient is kept (head_loss.cpp).
Tensor head_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets);
}  // namespace atl::ops

// ---- the op set for models beyond GPT (encoders, diffusion transformers, graph networks, MoE) ----
namespace atl::ops {

// a [B,M,K] · b [B,K,N] -> [B,M,N]
Tensor bmm(const Tensor& a, const Tensor& b);
// Over the last dim.
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
// x·sigmoid(x)
Tensor silu(const Tensor& x);
// Elementwise a·b with NumPy broadcasting (trailing dims aligned, size-1 dims stretched).
Tensor mul(const Tensor& a, const Tensor& b);

// Indices are i32 and checked against the indexed dim (negative dims count from the end).
// out = x.index_select(dim, index): index [M] picks M slices of x along dim.
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out[..., k, ...] = x[..., index[..., k, ...], ...] along dim (torch.gather); index has x's shape
// except along dim, where it may have any size.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
// base + src scattered-added along dim (torch.Tensor.scatter_add): out[..., index[..., k, ...], ...]
// += src[..., k, ...]; index has src's shape, src has base's shape except along dim.
Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src);
// Sparse aggregation: out[s] = sum of the rows x[n] with segment_ids[n] == s, for x [N, ...]
// -> [num_segments, ...]; ids need not be sorted (messages to nodes, tokens to experts).
Tensor segment_sum(const Tensor& x, const Tensor& segment_ids, int64_t num_segments);

// The k largest entries along the last dim, descending; indices i32 take no gradient, the values
// route theirs to where they came from. Ties go to the lower index.
struct TopK {
  Tensor values, indices;
};
TopK topk(const Tensor& x, int64_t k);

Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// Pieces of the given sizes along dim (they must sum to x.size(dim)).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);

// mean((pred - target)^2) over all elements -> scalar; both may take gradients.
Tensor mse_loss(const Tensor& pred, const Tensor& target);
// Weighted, masked cross-entropy: sum_i w_i m_i ce_i / sum_i w_i m_i over rows i of logits [N,V].
// weights [N] f32 and mask [N] i32 (nonzero = keep) may each be undefined (all ones); targets < 0
// are masked too. Zero total weight gives a zero loss and zero gradients.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& weights, const Tensor& mask);

// Attention over qkv [B,T,(H+2KV)*hd] -> [B,T,H*hd] with a mask other than plain causal:
// causal=false lets every query see the whole row (an encoder). doc_ids [B,T] i32, when defined,
// marks packed variable-length sequences: a maximal run of equal ids is one document, and a token
// sees only its own document's tokens (and only earlier ones when causal).
Tensor attention(const Tensor& qkv, int64_t H, int64_t KV, int64_t hd, bool causal, const Tensor& doc_ids);
// The same documents from cumulative sequence lengths (cu_seqlens = [0, len0, len0+len1, ..., T]
// for one packed row): doc ids [1,T] to pass to attention.
Tensor doc_ids_from_cu_seqlens(const std::vector<int64_t>& cu_seqlens);

// Inverted dropout with a counter-based mask: a function of (seed, rank, step, site) and the
// element index only, so it is deterministic given those, independent across ranks, steps and
// call sites (use a distinct site per layer), and the same for any thread count. 0 <= p < 1.
struct DropoutKey {
  uint64_t seed = 0, rank = 0, step = 0, site = 0;
};
Tensor dropout(const Tensor& x, float p, const DropoutKey& key);

}  // namespace atl::ops

// ---- mixture-of-experts ops (ops_moe.cpp) ----
namespace atl::ops {

// Grouped linear over rows sorted by expert: x [M,K], w [E,K,N], offsets [G+1] with offsets[0] = 0
// and offsets[G] = M; rows offsets[g]..offsets[g+1] use w[first + g] (first + G <= E). One
// grouped-GEMM kernel call.
Tensor grouped_linear(const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets, int64_t first = 0);
Tensor sigmoid(const Tensor& x);
// Each row divided by its sum (rows must have a nonzero sum).
Tensor normalize_rows(const Tensor& x);
// The same elements under another shape (a view; the gradient flows back reshaped).
Tensor reshape(const Tensor& x, const Shape& shape);

}  // namespace atl::ops
