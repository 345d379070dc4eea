// Hand-off of a bf16 copy from the op that produced a tensor to the bf16 matmul that consumes it
// next (bf16 mode, precision.h). A linear's bf16 input used to be a separate pass over the fp32
// activation (read 4 B, write 2 B per value); the producer (layer norm, GELU) can write the copy
// while the value is still in a register, and backward's GELU can hand c_fc its dY in bf16 with
// the bias's column sums. The fp32 tensor is still produced: the copy is an offer, not a change
// of what an op returns.
//
// Safety: tensors carry no version counter, so a copy is only valid while nothing can have
// touched the fp32 tensor since it was written. The rule kept here is the narrowest one that
// covers the GPT block: a forward copy is taken only by the very next op recorded after its
// producer (any record() in between drops it), and a gradient copy only by the very next node
// backward walks after the producing node (any node in between drops it). Each offer names the
// tensor by its autograd record and storage, and the taker must present that same tensor
// (storage, offset, shape). What can still defeat it: code between two ops that writes an op's
// output through its raw pointer; no op in this tree does (ops are functional).
// At most one copy of each kind is held, so an offer nobody takes costs one tensor's bf16 bytes
// until the next op (forward) or the next node after the one consumer could be (backward).
#pragma once
#include "autograd/graph.h"

namespace atl::bf16_handoff {

// Forward: `out` was just recorded by its producer (f32, contiguous); `copy` is f32_to_bf16(out).
void offer_output(const Tensor& out, Tensor copy);
// The offered copy if x is that output and no op has been recorded since; undefined otherwise.
// Taking it clears the offer.
Tensor take_output(const Tensor& x);

// Backward, from inside a node's backward: `of` (whose autograd record holds the gradient) just
// had its gradient written fresh (not accumulated); `grad_bf16` is f32_to_bf16 of it and
// `col_partials` [ceil(N/64), OC] the column sums of each 64-row block of the [N, OC] gradient
// (rows added in order from 0), the partials linear_bf16's bias gradient adds in block order.
void offer_grad(const Tensor& of, Tensor grad_bf16, Tensor col_partials);
struct Grad {
  Tensor bf16, col_partials;
};
// The offered gradient copy if `of` names the same record, the gradient is still the tensor it
// was written into, and exactly one node (the producer's) has been walked since the offer.
Grad take_grad(const Tensor& of);

// Off: producers offer nothing and every consumer casts (the unfused path, for tests and A/B
// comparisons; ATOLL_BF16_HANDOFF=0 starts a process with it off).
void set_enabled(bool on);
bool enabled();

// Counts taken offers (tests check the hand-off actually happens).
struct Stats {
  int64_t outputs_taken = 0, grads_taken = 0;
};
Stats stats();
// Bytes the pending offers hold now (a copy not yet taken; tests that count what a graph saves
// leave these out).
size_t pending_bytes();

namespace detail {
void op_recorded();  // graph.cpp: every record()
void node_walked();  // graph.cpp: after every node backward visits
}  // namespace detail

}  // namespace atl::bf16_handoff
