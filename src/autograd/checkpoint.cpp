#include "autograd/checkpoint.h"

#include "autograd/ops_util.h"

namespace atl {

Tensor checkpoint(const char* what, const Tensor& x, std::function<Tensor(const Tensor&)> f) {
  if (!grad_enabled()) return f(x);
  Tensor y;
  {
    NoGradGuard ng;
    y = f(x);
  }
  // Recorded even when x takes no gradient: f's parameters may.
  record(what, y, {x}, [f = std::move(f)](Node& n) {
    const Tensor& xin = n.inputs[0];
    Tensor g = grad_of(n.output);
    Tensor xr = xin.view(xin.shape());  // the same storage, a leaf of the inner graph
    set_requires_grad(xr, true, "checkpoint input");
    {
      TapeScope scope;  // the outer tape is being walked; the recomputation records apart
      Tensor yr = f(xr);
      if (requires_grad(yr)) backward_from(yr, g);
    }
    if (!requires_grad(xin)) return;
    Tensor gx = grad_of(xr);
    if (!gx.defined()) return;
    AutogradMeta& m = *xin.autograd();
    if (!m.grad.defined()) m.grad = gx;  // hand the buffer on: exactly what the inner graph summed
    else ops::detail::K(gx).elem.add_inplace(m.grad.f32(), gx.f32(), gx.numel());
  });
  return y;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& s, const std::string& where) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  fail("{}: recompute '{}' is not one of none, selective, full", where, s);
}

}  // namespace atl
