// The bf16 forms of ops::linear and ops::linear_t (see precision.h). Forward saves the bf16
// copies, so backward reads half the bytes and converts nothing but the incoming gradient. The
// node does not keep the fp32 input alive: it holds a stand-in that carries the input's autograd
// record (all backward needs of it: where its gradient accumulates) over the bf16 copy's storage,
// so an activation that only feeds a linear layer is kept once, in bf16, until backward. The
// weight's bf16 copy comes from the step's cache (weight_cast_cache.h): converted once per step,
// shared by forward and the dX product of every micro-step.
#include "autograd/linear_bf16.h"

#include "autograd/bf16_handoff.h"
#include "autograd/weight_cast_cache.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/gelu_bf16.h"
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

// x in bf16: the copy its producer offered (layer norm, GELU: bf16_handoff.h), else a cast.
Tensor input_bf16(const Tensor& x) {
  Tensor b = bf16_handoff::take_output(x);
  return b.defined() ? b : to_bf16(x);
}

// A tensor with t's autograd record (and shape) whose storage is the bf16 copy: the node's input.
Tensor stand_in(const Tensor& t, const Tensor& copy) {
  Tensor s = copy;
  s.set_autograd(t.autograd());
  return s;
}

// out = bf16(g) and db[OC] += column sums of g[N,OC], in one pass over g. Blocks of 64 rows are
// summed (rows in order) into their own partials, which are then added to db in block order: the
// same order for any thread count.
void to_bf16_with_column_sums(bf16* out, float* db, const float* g, int64_t N, int64_t OC) {
  constexpr int64_t kRows = cpu::kBiasSumRows;  // GELU's backward hands over partials of these blocks
  const int64_t nblk = (N + kRows - 1) / kRows;
  std::vector<float> part(size_t(nblk * OC), 0.0f);
#pragma omp parallel for schedule(static) if(parallel : N * OC >= (int64_t(1) << 15))
  for (int64_t blk = 0; blk < nblk; ++blk) {
    float* p = part.data() + blk * OC;
    for (int64_t i = blk * kRows; i < std::min(N, (blk + 1) * kRows); ++i) {
      const float* gi = g + i * OC;
      cpu::f32_to_bf16(gi, out + i * OC, OC);
#pragma omp simd
      for (int64_t o = 0; o < OC; ++o) p[o] += gi[o];
    }
  }
  for (int64_t blk = 0; blk < nblk; ++blk)
#pragma omp simd
    for (int64_t o = 0; o < OC; ++o) db[o] += part[size_t(blk * OC + o)];
}
}  // namespace

void set_matmul_dtype(DType dt) {
  ATOLL_CHECK(dt == DType::f32 || dt == DType::bf16, "matmul dtype must be f32 or bf16, got {}", dtype_name(dt));
  g_matmul = dt;
}
DType matmul_dtype() { return g_matmul; }

namespace ops_bf16 {

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, int64_t N, int64_t C, int64_t OC, Shape out_shape) {
  Tensor xb = input_bf16(x), wb = bf16_weight(w);
  Tensor out = Tensor::empty(out_shape);
  float* o = out.f32();
  if (b.defined()) cpu::gemm_bf16_bias(false, false, N, OC, C, xb.data<bf16>(), C, wb.data<bf16>(), OC, b.f32(), o, OC);
  else cpu::gemm_bf16(false, false, N, OC, C, 1.f, xb.data<bf16>(), C, wb.data<bf16>(), OC, 0.f, o, OC);
  if (should_record({&x, &w, &b})) {
    record("linear_bf16", out, {stand_in(x, xb), w, b}, [N, C, OC, xb, wb](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1], &bi = n.inputs[2];
      const Tensor& g = grad_of(n.output);
      const bool bias = bi.defined() && requires_grad(bi);
      bf16_handoff::Grad h = bf16_handoff::take_grad(n.output);  // GELU's backward made them already
      Tensor gb = h.bf16;
      const int64_t nblk = (N + cpu::kBiasSumRows - 1) / cpu::kBiasSumRows;
      if (gb.defined() && bias && (h.col_partials.dim() != 2 || h.col_partials.size(0) != nblk ||
                                   h.col_partials.size(1) != OC))
        gb = Tensor();  // partials of another row width: not this product's bias sums
      if (gb.defined()) {
        if (bias) {
          float* db = grad_buffer(bi).f32();
          const float* part = h.col_partials.f32();
          for (int64_t blk = 0; blk < h.col_partials.size(0); ++blk)  // to_bf16_with_column_sums's order
#pragma omp simd
            for (int64_t o = 0; o < OC; ++o) db[o] += part[blk * OC + o];
        }
      } else {
        gb = Tensor::empty(g.shape(), DType::bf16);
        if (bias) to_bf16_with_column_sums(gb.data<bf16>(), grad_buffer(bi).f32(), g.f32(), N, OC);  // one pass over g
        else cpu::f32_to_bf16(g.f32(), gb.data<bf16>(), g.numel());
      }
      if (requires_grad(xi)) {
        bool fresh;
        float* gx = grad_buffer_for_write(xi, &fresh).f32();
        cpu::gemm_bf16(false, true, N, C, OC, 1.f, gb.data<bf16>(), OC, wb.data<bf16>(), OC, fresh ? 0.f : 1.f, gx, C);
      }
      if (requires_grad(wi))
        cpu::gemm_bf16(true, false, C, OC, N, 1.f, xb.data<bf16>(), C, gb.data<bf16>(), OC, 1.f, grad_buffer(wi).f32(), OC);
    });
  }
  return out;
}

Tensor linear_t(const Tensor& x, const Tensor& w, int64_t N, int64_t C, int64_t OC, Shape out_shape) {
  Tensor xb = input_bf16(x), wb = bf16_weight(w);
  Tensor out = Tensor::empty(out_shape);
  cpu::gemm_bf16(false, true, N, OC, C, 1.f, xb.data<bf16>(), C, wb.data<bf16>(), C, 0.f, out.f32(), OC);
  if (should_record({&x, &w})) {
    record("linear_t_bf16", out, {stand_in(x, xb), w}, [N, C, OC, xb, wb](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1];
      Tensor gb = bf16_handoff::take_grad(n.output).bf16;
      if (!gb.defined()) gb = to_bf16(grad_of(n.output));
      if (requires_grad(xi)) {
        bool fresh;
        float* gx = grad_buffer_for_write(xi, &fresh).f32();
        cpu::gemm_bf16(false, false, N, C, OC, 1.f, gb.data<bf16>(), OC, wb.data<bf16>(), C, fresh ? 0.f : 1.f, gx, C);
      }
      if (requires_grad(wi))
        cpu::gemm_bf16(true, false, OC, C, N, 1.f, gb.data<bf16>(), OC, xb.data<bf16>(), C, 1.f, grad_buffer(wi).f32(), C);
    });
  }
  return out;
}

}  // namespace ops_bf16
}  // namespace atl
