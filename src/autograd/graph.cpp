#include "autograd/graph.h"

#include "autograd/bf16_handoff.h"

#include <unordered_map>
#include <unordered_set>

namespace atl {
namespace {

thread_local Tape g_thread_tape;
thread_local Tape* g_tape = &g_thread_tape;
thread_local WeightGradDeferral* g_deferral = nullptr;
thread_local bool g_grad_enabled = true;

AutogradMeta& meta(const Tensor& t) {
  ATOLL_CHECK(t.autograd() != nullptr, "tensor has no autograd record");
  return *t.autograd();
}

}  // namespace

void set_requires_grad(Tensor& t, bool on, const std::string& name, Tensor grad) {
  if (!on) {
    t.set_autograd(nullptr);
    return;
  }
  auto m = std::make_shared<AutogradMeta>();
  m->requires_grad = true;
  m->is_leaf = true;
  m->name = name;
  if (grad.defined()) {
    ATOLL_CHECK(grad.shape() == t.shape(), "gradient buffer {} for parameter {} of shape {}", shape_str(grad.shape()),
                name, shape_str(t.shape()));
    m->grad = grad;
  }
  t.set_autograd(std::move(m));
}

bool requires_grad(const Tensor& t) { return t.autograd() && t.autograd()->requires_grad; }

Tensor grad_of(const Tensor& t) { return t.autograd() ? t.autograd()->grad : Tensor(); }

Tensor& grad_buffer(const Tensor& t) {
  AutogradMeta& m = meta(t);
  if (!m.grad.defined()) m.grad = Tensor::zeros(t.shape(), DType::f32, t.device());
  return m.grad;
}

Tensor& grad_buffer_for_write(const Tensor& t, bool* fresh) {
  AutogradMeta& m = meta(t);
  *fresh = !m.grad.defined();
  if (*fresh) m.grad = Tensor::empty(t.shape(), DType::f32, t.device());
  return m.grad;
}

void add_grad_hook(Tensor& leaf, std::function<void(const Tensor&)> hook) {
  ATOLL_CHECK(requires_grad(leaf), "add_grad_hook on a tensor that does not require grad");
  meta(leaf).hooks.push_back(std::move(hook));
}

void clear_grad_hooks(Tensor& leaf) {
  if (leaf.autograd()) leaf.autograd()->hooks.clear();
}

bool grad_enabled() { return g_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(g_grad_enabled) { g_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { g_grad_enabled = prev_; }

bool should_record(std::initializer_list<const Tensor*> ts) {
  if (!g_grad_enabled) return false;
  for (const Tensor* t : ts)
    if (t && t->defined() && requires_grad(*t)) return true;
  return false;
}

Tensor grad_handle(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor h = Tensor::wrap(nullptr, t.shape(), t.dtype(), t.device());
  h.set_autograd(t.autograd());
  return h;
}

void record(const char* op, Tensor& out, std::vector<Tensor> inputs, std::function<void(Node&)> backward) {
  bf16_handoff::detail::op_recorded();
  auto m = std::make_shared<AutogradMeta>();
  m->requires_grad = true;
  m->is_leaf = false;
  out.set_autograd(m);
  Node n;
  n.op = op;
  n.inputs = std::move(inputs);
  // The node keeps only a handle to its output (shape and autograd record, no data): backward
  // needs the output's gradient, never its values (an op that does captures them itself), and
  // holding the data would keep every activation alive until backward, saved by a consumer or not.
  n.output = grad_handle(out);
  n.backward = std::move(backward);
  g_tape->nodes.push_back(std::move(n));
}

namespace {
// Walks `nodes` (a tape taken out of the active one, so that a node's backward may record and run
// a tape of its own: recomputation) in reverse, firing leaf hooks as their gradients become final.
void walk(std::vector<Node>& nodes) {
  // A leaf's gradient is final once the node of its first forward use has run backward. Leaves
  // that share that node fire in the order of its inputs: never in an order that depends on
  // addresses, because DDP issues its collectives from these hooks and every rank must issue
  // them in the same order.
  std::unordered_set<AutogradMeta*> seen;
  std::unordered_map<size_t, std::vector<AutogradMeta*>> fire_at;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (auto& in : nodes[i].inputs)
      if (in.defined() && in.autograd() && in.autograd()->is_leaf && !in.autograd()->hooks.empty() &&
          seen.insert(in.autograd().get()).second)
        fire_at[i].push_back(in.autograd().get());

  for (size_t i = nodes.size(); i-- > 0;) {
    Node& n = nodes[i];
    AutogradMeta* om = n.output.autograd().get();
    if (om && om->grad.defined()) n.backward(n);
    bf16_handoff::detail::node_walked();
    // The output's gradient and the node's saved tensors are no longer needed.
    if (om) om->grad = Tensor();
    n.inputs.clear();
    n.output = Tensor();
    n.backward = nullptr;
    auto it = fire_at.find(i);
    if (it != fire_at.end())
      for (AutogradMeta* m : it->second)
        for (auto& h : m->hooks) h(m->grad);
  }
  nodes.clear();
}

void run_tape() {
  std::vector<Node> nodes = std::move(g_tape->nodes);
  g_tape->nodes.clear();
  walk(nodes);
}
}  // namespace

void backward_from(const Tensor& out, const Tensor& grad) {
  ATOLL_CHECK(requires_grad(out), "backward_from(): the output does not depend on anything that requires grad");
  ATOLL_CHECK(grad.shape() == out.shape(), "backward_from(): gradient {} for an output of shape {}",
              shape_str(grad.shape()), shape_str(out.shape()));
  out.autograd()->grad = grad;
  run_tape();
}

TapeScope::TapeScope() : owned_(std::make_unique<Tape>()), prev_(g_tape) { g_tape = owned_.get(); }

void backward(const Tensor& loss, float seed) {
  ATOLL_CHECK(loss.numel() == 1, "backward() needs a scalar loss, got shape {}", shape_str(loss.shape()));
  ATOLL_CHECK(requires_grad(loss), "backward(): the loss does not depend on anything that requires grad");
  grad_buffer(loss).fill(seed);
  run_tape();
}

void backward(const Tensor& out, const Tensor& grad) {
  ATOLL_CHECK(requires_grad(out), "backward(): the output does not depend on anything that requires grad");
  ATOLL_CHECK(grad.shape() == out.shape(), "backward(): gradient of shape {} for an output of shape {}",
              shape_str(grad.shape()), shape_str(out.shape()));
  grad_buffer(out).copy_from(grad);
  run_tape();
}

void clear_tape() { g_tape->nodes.clear(); }
size_t tape_size() { return g_tape->nodes.size(); }

TapeScope::TapeScope(Tape& t) : prev_(g_tape) { g_tape = &t; }
TapeScope::~TapeScope() { g_tape = prev_; }

WeightGradDeferral::WeightGradDeferral() : prev_(g_deferral) { g_deferral = this; }
WeightGradDeferral::~WeightGradDeferral() {
  if (active_) g_deferral = prev_;
}
std::vector<std::function<void()>> WeightGradDeferral::take() {
  if (active_) g_deferral = prev_;
  active_ = false;
  return std::move(work_);
}
bool defer_weight_grad(std::function<void()>& work) {
  if (!g_deferral) return false;
  g_deferral->work_.push_back(std::move(work));
  return true;
}

}  // namespace atl
