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

// Runs backward from a scalar (one-element) tensor, seeding its gradient with `seed`, then clears
// the tape (freeing saved activations). Gradients of non-leaf tensors are freed as they are used.
void backward(const Tensor& loss, float seed = 1.f);
// Runs the thread's tape backward from a tensor of any shape whose gradient is `grad` (the
// buffer is handed over, not copied), then clears the tape. For ops that record a graph of their
// own inside a node's backward (activation recomputation, autograd/checkpoint.h).
void backward_from(const Tensor& out, const Tensor& grad);
// While alive the thread records onto a fresh tape; the one before it comes back on destruction.
class TapeScope {
 public:
  TapeScope();
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
  std::unique_ptr<std::vector<Node>> saved_;
};
// Drops the recorded graph without running it (e.g. after an evaluation forward with grad on).
void clear_tape();
size_t tape_size();

}  // namespace atl
