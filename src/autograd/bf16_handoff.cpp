// The one-slot offers of bf16_handoff.h. Thread-local: a tape is recorded and walked on one thread
// (OpenMP workers run kernels, never ops).
#include "autograd/bf16_handoff.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace atl::bf16_handoff {
namespace {

struct Offer {
  std::weak_ptr<AutogradMeta> meta;
  std::weak_ptr<Storage> storage;  // of the fp32 tensor (output or gradient) the copy is of
  int64_t offset = 0;
  Shape shape;
  uint64_t epoch = 0;
  Tensor bf16, partials;
  bool live = false;
  void clear() { *this = Offer(); }
};

thread_local uint64_t g_epoch = 1;
thread_local Offer g_out, g_grad;
thread_local Stats g_stats;
bool g_enabled = [] {
  const char* e = std::getenv("ATOLL_BF16_HANDOFF");
  return !(e && std::strcmp(e, "0") == 0);
}();

Offer make(const Tensor& named, const Tensor& values, Tensor copy, Tensor partials) {
  Offer o;
  o.meta = named.autograd();
  o.storage = values.storage();
  o.offset = values.offset();
  o.shape = values.shape();
  o.epoch = g_epoch;
  o.bf16 = std::move(copy);
  o.partials = std::move(partials);
  o.live = true;
  return o;
}

bool names(const Offer& o, const Tensor& named, const Tensor& values) {
  if (!o.live || !named.autograd() || o.meta.lock() != named.autograd()) return false;
  return values.defined() && o.storage.lock() == values.storage() && o.offset == values.offset() &&
         o.shape == values.shape() && values.dtype() == DType::f32 && values.is_contiguous();
}
}  // namespace

void set_enabled(bool on) {
  g_enabled = on;
  g_out.clear();
  g_grad.clear();
}
bool enabled() { return g_enabled; }

void offer_output(const Tensor& out, Tensor copy) {
  if (!g_enabled || !out.autograd()) return;
  g_out = make(out, out, std::move(copy), Tensor());
}

Tensor take_output(const Tensor& x) {
  if (!g_out.live || g_out.epoch != g_epoch || !names(g_out, x, x)) return Tensor();
  Tensor c = std::move(g_out.bf16);
  g_out.clear();
  ++g_stats.outputs_taken;
  return c;
}

void offer_grad(const Tensor& of, Tensor grad_bf16, Tensor col_partials) {
  if (!g_enabled || !of.autograd()) return;
  g_grad = make(of, of.autograd()->grad, std::move(grad_bf16), std::move(col_partials));
}

Grad take_grad(const Tensor& of) {
  // The producer's node is walked once after the offer (epoch + 1); any further node, or an op
  // recorded in between (recomputation), moves the epoch on.
  if (!g_grad.live || g_grad.epoch + 1 != g_epoch || !of.autograd() || !names(g_grad, of, of.autograd()->grad))
    return {};
  Grad g{std::move(g_grad.bf16), std::move(g_grad.partials)};
  g_grad.clear();
  ++g_stats.grads_taken;
  return g;
}

Stats stats() { return g_stats; }

size_t pending_bytes() {
  size_t n = 0;
  for (const Offer* o : {&g_out, &g_grad})
    if (o->live) n += (o->bf16.defined() ? o->bf16.nbytes() : 0) + (o->partials.defined() ? o->partials.nbytes() : 0);
  return n;
}

namespace detail {
void op_recorded() {
  ++g_epoch;
  if (g_out.live) g_out.clear();
  if (g_grad.live && g_grad.epoch + 1 < g_epoch) g_grad.clear();
}
void node_walked() {
  ++g_epoch;
  if (g_out.live) g_out.clear();
  if (g_grad.live && g_grad.epoch + 1 < g_epoch) g_grad.clear();
}
}  // namespace detail

}  // namespace atl::bf16_handoff
