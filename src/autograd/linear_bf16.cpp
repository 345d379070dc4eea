// The bf16 forms of ops::linear and ops::linear_t (see precision.h). Forward saves the bf16
// copies, so backward reads half the bytes and converts nothing but the incoming gradient. The
// node does not keep the fp32 input alive: it holds a stand-in that carries the input's autograd
// record (all backward needs of it: where its gradient accumulates) over the bf16 copy's storage,
// so an activation that only feeds a linear layer is kept once, in bf16, until backward. The
// weight's bf16 copy comes from the step's cache (weight_cast_cache.h): converted once per step,
// shared by forward and the dX product of every micro-step.
#include "autograd/linear_bf16.h"

#include "autograd/weight_cast_cache.h"

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernels.h"

namespace atl {
namespace {
DType g_matmul = DType::f32;

Tensor to_bf16(const Tensor& t) {
  Tensor b = Tensor::empty(t.shape(), DType::bf16);
  cpu::f32_to_bf16(t.f32(), b.data<bf16>(), t.numel());
  return b;
}

// A tensor with t's autograd record (and shape) whose storage is the bf16 copy: the node's input.
Tensor stand_in(const Tensor& t, const Tensor& copy) {
  Tensor s = copy;
  s.set_autograd(t.autograd());
  return s;
}

// dbias[OC] += column sums of dout[N,OC]
void bias_grad(float* db, const float* dout, int64_t N, int64_t OC) {
  for (int64_t i = 0; i < N; ++i)
    for (int64_t o = 0; o < OC; ++o) db[o] += dout[i * OC + o];
}
}  // namespace

void set_matmul_dtype(DType dt) {
  ATOLL_CHECK(dt == DType::f32 || dt == DType::bf16, "matmul dtype must be f32 or bf16, got {}", dtype_name(dt));
  g_matmul = dt;
}
DType matmul_dtype() { return g_matmul; }

namespace ops_bf16 {

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, int64_t N, int64_t C, int64_t OC, Shape out_shape) {
  Tensor xb = to_bf16(x), wb = bf16_weight(w);
  Tensor out = Tensor::empty(out_shape);
  float* o = out.f32();
  if (b.defined()) {
    const float* bp = b.f32();
    for (int64_t i = 0; i < N; ++i)
      for (int64_t j = 0; j < OC; ++j) o[i * OC + j] = bp[j];
  }
  cpu::gemm_bf16(false, false, N, OC, C, 1.f, xb.data<bf16>(), C, wb.data<bf16>(), OC, b.defined() ? 1.f : 0.f, o, OC);
  if (should_record({&x, &w, &b})) {
    record("linear_bf16", out, {stand_in(x, xb), w, b}, [N, C, OC, xb, wb](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1], &bi = n.inputs[2];
      const Tensor& g = grad_of(n.output);
      Tensor gb = to_bf16(g);
      if (requires_grad(xi))
        cpu::gemm_bf16(false, true, N, C, OC, 1.f, gb.data<bf16>(), OC, wb.data<bf16>(), OC, 1.f, grad_buffer(xi).f32(), C);
      if (requires_grad(wi))
        cpu::gemm_bf16(true, false, C, OC, N, 1.f, xb.data<bf16>(), C, gb.data<bf16>(), OC, 1.f, grad_buffer(wi).f32(), OC);
      if (bi.defined() && requires_grad(bi)) bias_grad(grad_buffer(bi).f32(), g.f32(), N, OC);
    });
  }
  return out;
}

Tensor linear_t(const Tensor& x, const Tensor& w, int64_t N, int64_t C, int64_t OC, Shape out_shape) {
  Tensor xb = to_bf16(x), wb = bf16_weight(w);
  Tensor out = Tensor::empty(out_shape);
  cpu::gemm_bf16(false, true, N, OC, C, 1.f, xb.data<bf16>(), C, wb.data<bf16>(), C, 0.f, out.f32(), OC);
  if (should_record({&x, &w})) {
    record("linear_t_bf16", out, {stand_in(x, xb), w}, [N, C, OC, xb, wb](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1];
      Tensor gb = to_bf16(grad_of(n.output));
      if (requires_grad(xi))
        cpu::gemm_bf16(false, false, N, C, OC, 1.f, gb.data<bf16>(), OC, wb.data<bf16>(), C, 1.f, grad_buffer(xi).f32(), C);
      if (requires_grad(wi))
        cpu::gemm_bf16(true, false, OC, C, N, 1.f, gb.data<bf16>(), OC, xb.data<bf16>(), C, 1.f, grad_buffer(wi).f32(), C);
    });
  }
  return out;
}

}  // namespace ops_bf16
}  // namespace atl
