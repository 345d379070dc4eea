// The activation between a block's two MLP products is its largest saved tensor ([N, 4C] for
// GELU, [N, 2F] for SwiGLU). In bf16 mode it is kept for backward as a bf16 copy (half the bytes)
// and widened again when backward runs; forward and the output stay fp32. The derivative is then
// evaluated at the input rounded to bf16 (relative error <= 2^-9): an error of the size bf16 mode
// already makes in the matmuls that consume these gradients, which
// MixedPrecision.Bf16TrainingTracksFp32For100StepsOnEveryPath bounds over 100 steps.
#include "autograd/activations_bf16.h"

#include "autograd/bf16_handoff.h"
#include "autograd/ops_util.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gelu_bf16.h"
#include "kernels/cpu/kernels.h"

namespace atl::ops_bf16 {
namespace {
using ops::detail::K;

Tensor to_bf16(const Tensor& t) {
  Tensor b = Tensor::empty(t.shape(), DType::bf16);
  cpu::f32_to_bf16(t.f32(), b.data<bf16>(), t.numel());
  b.set_autograd(t.autograd());  // the saved input stands in for t: its gradient accumulates in t's
  return b;
}

Tensor widen(const Tensor& b) {
  Tensor f = Tensor::empty(b.shape());
  cpu::bf16_to_f32(b.data<bf16>(), f.f32(), b.numel());
  return f;
}
}  // namespace

// GELU's forward writes the saved bf16 copy in its own pass over x, and backward reads it directly
// and writes a fresh gradient (kernels/cpu/gelu.cpp): no separate cast, widening or zeroing pass.
// Both directions also write the bf16 copy the next product reads and offer it (bf16_handoff.h):
// forward its output for c_proj's input, backward a fresh gradient for c_fc's dY, with the bias's
// column sums.
Tensor gelu(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape());
  if (!should_record({&x})) {
    K(x).act.gelu_forward(out.f32(), x.f32(), x.numel());
    return out;
  }
  const bool hand_off = bf16_handoff::enabled();
  Tensor saved = Tensor::empty(x.shape(), DType::bf16), out_b;
  if (hand_off) {
    out_b = Tensor::empty(x.shape(), DType::bf16);
    cpu::gelu_forward_keep_bf16(out.f32(), out_b.data<bf16>(), saved.data<bf16>(), x.f32(), x.numel());
  } else {
    cpu::gelu_forward_keep_bf16(out.f32(), saved.data<bf16>(), x.f32(), x.numel());
  }
  saved.set_autograd(x.autograd());  // the saved input stands in for x: its gradient accumulates in x's
  record("gelu_bf16", out, {saved}, [hand_off](Node& n) {
    const Tensor& xi = n.inputs[0];
    bool fresh;
    float* gx = grad_buffer_for_write(xi, &fresh).f32();
    if (!fresh || !hand_off || xi.dim() == 0) {
      cpu::gelu_backward_bf16(gx, grad_of(n.output).f32(), xi.data<bf16>(), xi.numel(), !fresh);
      return;
    }
    const int64_t OC = xi.size(-1), N = OC ? xi.numel() / OC : 0;
    Tensor gb = Tensor::empty(xi.shape(), DType::bf16);
    Tensor part = Tensor::empty({(N + cpu::kBiasSumRows - 1) / cpu::kBiasSumRows, OC});
    cpu::gelu_backward_bf16_rows(gx, gb.data<bf16>(), part.f32(), grad_of(n.output).f32(), xi.data<bf16>(), N, OC);
    bf16_handoff::offer_grad(xi, std::move(gb), std::move(part));
  });
  if (hand_off) bf16_handoff::offer_output(out, std::move(out_b));
  return out;
}

Tensor swiglu(const Tensor& x) {
  const int64_t F = x.size(-1) / 2, N = x.numel() / x.size(-1);
  Shape s = x.shape();
  s.back() = F;
  Tensor out = Tensor::empty(s);
  K(x).act.swiglu_forward(out.f32(), x.f32(), N, F);
  if (should_record({&x})) {
    record("swiglu_bf16", out, {to_bf16(x)}, [N, F](Node& n) {
      const Tensor& xi = n.inputs[0];
      const Tensor xf = widen(xi);
      K(xf).act.swiglu_backward(grad_buffer(xi).f32(), grad_of(n.output).f32(), xf.f32(), N, F);
    });
  }
  return out;
}

}  // namespace atl::ops_bf16
