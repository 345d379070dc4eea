// Reverse-mode autograd over a recorded tape.
//
// Ops (autograd/ops.h) run their forward kernel at once and, when gradients are wanted, append a
// node to the thread's tape holding what backward needs. backward() walks the tape in reverse;
// each node reads its output's gradient and ACCUMULATES into its inputs' gradients. Parameters
// (leaves) keep their gradient across backward calls until zeroed, which is how micro-batches
// accumulate. A leaf's hooks fire as soon as its gradient for this backward is final (the node of
// its first forward use has run): DDP starts its all-reduce from there, overlapped with the rest.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace atl {

struct AutogradMeta {
  bool requires_grad = false;
  bool is_leaf = true;
  Tensor grad;  // same shape as the tensor, f32; allocated (zeroed) on first use unless preset
  std::vector<std::function<void(const Tensor& grad)>> hooks;  // leaves only
  std::string name;  // for error messages and debugging
};

struct Node {
  const char* op = "?";
  std::vector<Tensor> inputs;  // tensors whose gradients this node produces (may be undefined)
  Tensor output;
  std::function<void(Node&)> backward;  // reads grad_of(output), accumulates into grad_of(inputs)
};

// Marks t as a leaf that wants gradients; grad, if given, is where its gradient accumulates (a view
// into a flat buffer, say) and must be zeroed by the owner.
void set_requires_grad(Tensor& t, bool on = true, const std::string& name = "", Tensor grad = {});
bool requires_grad(const Tensor& t);
// The gradient accumulated into t (undefined if none yet).
Tensor grad_of(const Tensor& t);
// The gradient buffer of t, created zeroed if absent. For ops' backward functions.
Tensor& grad_buffer(const Tensor& t);
// The same for an op that can either overwrite or accumulate: when t has no gradient yet the
// buffer is created uninitialised and *fresh is set, so the op writes every element instead of
// adding to zeros (the zeroing pass was ~5% of a bf16 step at d384).
Tensor& grad_buffer_for_write(const Tensor& t, bool* fresh);
void add_grad_hook(Tensor& leaf, std::function<void(const Tensor& grad)> hook);
void clear_grad_hooks(Tensor& leaf);

// Recording.
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
// True if grad mode is on and any of ts requires grad: the op should record a node.
bool should_record(std::initializer_list<const Tensor*> ts);
// Records a node whose output is `out` (which becomes a non-leaf requiring grad).
void record(const char* op, Tensor& out, std::vector<Tensor> inputs, std::function<void(Node&)> backward);

// A data-less stand-in for t (its shape and autograd record, no storage): what a node keeps of an
// input whose gradient it routes but whose values its backward never reads (add's operands), so
// that recording does not keep the input's data alive.
Tensor grad_handle(const Tensor& t);

// Runs backward from a scalar (one-element) tensor, seeding its gradient with `seed`, then clears
// the tape (freeing saved activations). Gradients of non-leaf tensors are freed as they are used.
void backward(const Tensor& loss, float seed = 1.f);
// Runs the active tape backward from a tensor of any shape whose gradient is `grad` (the buffer
// is handed over, not copied), then clears the tape. For ops that record a graph of their own
// inside a node's backward (activation recomputation, autograd/checkpoint.h).
void backward_from(const Tensor& out, const Tensor& grad);
// Backward from a tensor of any shape whose gradient is given (a pipeline stage's output, seeded
// with the gradient the next stage sent back); `grad` has out's shape and is copied.
void backward(const Tensor& out, const Tensor& grad);

// A recorded graph. Ops record into the active tape: the thread's own unless a TapeScope names
// another. Pipeline schedules keep one tape per micro-batch in flight (1F1B holds several
// forwards before their backwards) and run backward() under the micro-batch's scope;
// recomputation records onto a fresh tape of its own inside a node's backward.
struct Tape {
  std::vector<Node> nodes;
};
class TapeScope {
 public:
  explicit TapeScope(Tape& t);  // records onto t while alive
  TapeScope();                  // records onto a fresh tape while alive
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
  std::unique_ptr<Tape> owned_;
  Tape* prev_;
};

// Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", 2023) split backward
// into the input-gradient pass B, which the previous stage waits for, and the weight-gradient
// pass W, which nobody waits for and so fills the pipeline's idle time. While a WeightGradDeferral
// is alive, ops whose weight gradient is a separate GEMM (linear, linear_t) compute only the
// input gradient and hand the weight-gradient work to it; run() does that work later, in the
// order it was deferred (so gradients accumulate in the same order as an unsplit backward).
class WeightGradDeferral {
 public:
  WeightGradDeferral();
  ~WeightGradDeferral();
  WeightGradDeferral(const WeightGradDeferral&) = delete;
  WeightGradDeferral& operator=(const WeightGradDeferral&) = delete;
  // Stops collecting (so the deferred work can outlive the scope) and returns what was deferred.
  std::vector<std::function<void()>> take();

 private:
  WeightGradDeferral* prev_;
  std::vector<std::function<void()>> work_;
  bool active_ = true;
  friend bool defer_weight_grad(std::function<void()>& work);
};
// For ops: when a deferral is collecting, takes `work` and returns true; else returns false and the
// op runs its weight gradient at once.
bool defer_weight_grad(std::function<void()>& work);
// Drops the recorded graph without running it (e.g. after an evaluation forward with grad on).
void clear_tape();
size_t tape_size();

}  // namespace atl
