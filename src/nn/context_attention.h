// Context parallelism as a model sees it: the sequence of every row is split over the ranks of a
// cp group, each rank running the whole model on its share of the tokens, and attention, the one
// layer that mixes positions, reaching the other ranks' keys and values through this interface.
// nn/ and models/ cannot talk to communicators (the layering rule); src/parallel/context_parallel.cpp
// implements it with ring attention and injects it into a model that plans ParallelStyle::sequence.
// A null ContextAttention (the default) is the plain single-rank forward.
#pragma once
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace atl::nn {

// Positions [start, start + length) of a row.
using Span = std::pair<int64_t, int64_t>;

class ContextAttention {
 public:
  virtual ~ContextAttention() = default;
  // The ranks a row is split over (a rank's share of a row of T tokens is T / ranks()).
  virtual int64_t ranks() const = 0;
  // The spans of a row of length T that this rank holds, in the order its local tokens keep them
  // (increasing positions). Positions are global: RoPE and learned positions use them.
  virtual std::vector<Span> spans(int64_t T) const = 0;
  // The same for any rank of the group (the whole row's layout: an MoE router's capacity is
  // served first come, first served in the row's order, nn/moe.cpp).
  virtual std::vector<Span> spans_of(int64_t rank, int64_t T) const = 0;
  // Attention of this rank's queries qkv [B, Tl, (H+2KV)*hd] (Tl = the spans' total) over the
  // whole row of length T -> [B, Tl, H*hd]; causal over global positions, doc_ids [B, T] i32 (the
  // whole row's, may be undefined) masks packed documents as ops::attention does.
  virtual Tensor attention(const Tensor& qkv, int64_t H, int64_t KV, int64_t hd, int64_t T, bool causal,
                           const Tensor& doc_ids) const = 0;
  // The factor that turns this rank's mean loss over `kept_local` targets into its share of the
  // group's mean (kept_local * ranks / kept over the group), so that averaging the ranks' losses
  // and gradients, as data parallelism does, gives the mean over all the group's tokens.
  virtual double loss_share(int64_t kept_local) const = 0;
  // Sums v element-wise over the group, in place (every rank must call it with the same length):
  // batch statistics that are functions of the whole row, such as an MoE router's per-expert
  // counts for its balance loss (nn/moe.cpp). Integers, so the sum is exact in any order.
  virtual void sum_over_ranks(std::vector<int64_t>& v) const = 0;
};

// A model whose attention can run context-parallel; the pointer must outlive its use (null: local).
class SequenceSharded {
 public:
  virtual ~SequenceSharded() = default;
  virtual void set_context_attention(const ContextAttention* cp) = 0;
};

// Columns of x [B, T] (i32 or f32 rows of any width) at the spans' positions -> [B, Tl, ...].
Tensor take_spans(const Tensor& x, const std::vector<Span>& spans);
// The spans' positions in order.
std::vector<int32_t> span_positions(const std::vector<Span>& spans);
// A rank's mean cross-entropy over its local targets (ignored ones < 0) scaled by the group's
// loss_share, so that the ranks' losses averaged as data parallelism averages them are the mean
// over the whole rows' targets (a collective over the group). Shared by the families with cp.
Tensor context_share_of_loss(const Tensor& loss, const Tensor& local_targets, const ContextAttention& cp);

}  // namespace atl::nn
