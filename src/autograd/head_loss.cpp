// The LM head and its cross-entropy as one op. In fp32 mode it is exactly
// cross_entropy(linear_t(x, w), targets, reuse_logits). In bf16 mode (precision.h) the [N, V]
// logits, the largest activation of a small model, never exist whole: forward walks blocks of rows,
// computes each block's logits (bf16 product, fp32 out), its losses and, at once, its logit
// gradient for a unit upstream gradient, (softmax - onehot) / kept, and keeps that gradient in
// bf16 (N·V·2 bytes instead of the N·V·4 of fp32 logits). Backward only multiplies: the dX and dW
// products read the bf16 gradient, with the upstream gradient as the products' scale. The unfused
// bf16 path rounds the very same values to bf16 before the same products (up to that scale, a
// power of two for accumulation's 1/k, where rounding and scaling commute), so the two differ only
// through the blocked forward product's summation order.
#include <algorithm>

#include "autograd/bf16_handoff.h"
#include "autograd/ops.h"
#include "autograd/ops_util.h"
#include "autograd/precision.h"
#include "autograd/weight_cast_cache.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernels.h"

namespace atl::ops {
namespace {
using detail::K;

// Logits per row block: about 4 MiB of fp32. The block is live at the step's memory peak (the end
// of forward, with every saved activation), so it is kept small: at d384 (V = 8192, 128 rows a
// block) 2M logits put the bf16 peak at 0.757x fp32's, 1M at 0.747x (docs/mixed_precision.md).
// Rows come in whole 16-row AMX tiles, at least two: GPT-2's V = 50257 would otherwise get 20 rows,
// a second tile a quarter full.
constexpr int64_t kBlockElems = int64_t(1) << 20;
int64_t block_rows(int64_t V, int64_t N) {
  const int64_t tiles = kBlockElems / std::max<int64_t>(V, 1) / 16;
  return std::clamp<int64_t>(std::max<int64_t>(2, tiles) * 16, 1, std::max<int64_t>(N, 1));
}

Tensor head_loss_bf16(const Tensor& x, const Tensor& w, const Tensor& targets) {
  const int64_t V = w.size(0), C = w.size(1), N = detail::rows(x);
  const int32_t* tg = targets.i32();
  int64_t kept = 0;
  for (int64_t i = 0; i < N; ++i) {
    ATOLL_CHECK(tg[i] < V, "cross_entropy: target id {} at row {} is outside the vocabulary [0, {})", tg[i], i, V);
    kept += tg[i] >= 0;
  }
  Tensor xb = bf16_handoff::take_output(x);  // the final layer norm's copy (bf16_handoff.h)
  if (!xb.defined()) {
    xb = Tensor::empty(x.shape(), DType::bf16);
    cpu::f32_to_bf16(x.f32(), xb.data<bf16>(), x.numel());
  }
  const Tensor wb = bf16_weight(w);
  const bool rec = should_record({&x, &w});
  Tensor dlog = rec ? Tensor::empty({N, V}, DType::bf16) : Tensor();
  const int64_t R = block_rows(V, N);
  Tensor block = Tensor::empty({R, V}), losses = Tensor::empty({N}), lse = Tensor::empty({N}), dl = Tensor::empty({R});
  const float g = 1.f / float(kept ? kept : 1);  // each row's upstream gradient, for a unit loss gradient
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t r = std::min(R, N - r0);
    float* lg = block.f32();
    cpu::gemm_bf16(false, true, r, V, C, 1.f, xb.data<bf16>() + r0 * C, C, wb.data<bf16>(), C, 0.f, lg, V);
    if (rec && bf16_handoff::enabled()) {
      // Loss, gradient and its bf16 copy row by row, each row read from cache after the first
      // pass: the same bits as the three passes below (ATOLL_BF16_HANDOFF=0 keeps those, for A/B).
      cpu::crossentropy_rows_bf16(losses.f32() + r0, lse.f32() + r0, lg, dlog.data<bf16>() + r0 * V, tg + r0, g, r, V);
      continue;
    }
    K(block).softmax.crossentropy_forward(losses.f32() + r0, lse.f32() + r0, lg, tg + r0, r, V);
    if (!rec) continue;
    dl.fill(g);
    K(block).softmax.crossentropy_backward(lg, dl.f32(), lg, lse.f32() + r0, tg + r0, r, V);
    cpu::f32_to_bf16(lg, dlog.data<bf16>() + r0 * V, r * V);
  }
  const double total = K(losses).reduce.sum(losses.f32(), N);
  Tensor out = Tensor::full({1}, kept ? float(total / double(kept)) : 0.f);
  if (rec) {
    xb.set_autograd(x.autograd());  // the saved bf16 input stands in for x (linear_bf16.cpp's way)
    record("head_loss_bf16", out, {xb, w}, [N, C, V, xb, wb, dlog](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1];
      const float s = grad_of(n.output).item();
      if (requires_grad(xi)) {
        bool fresh;
        float* gx = grad_buffer_for_write(xi, &fresh).f32();
        cpu::gemm_bf16(false, false, N, C, V, s, dlog.data<bf16>(), V, wb.data<bf16>(), C, fresh ? 0.f : 1.f, gx, C);
      }
      if (requires_grad(wi))
        cpu::gemm_bf16(true, false, V, C, N, s, dlog.data<bf16>(), V, xb.data<bf16>(), C, 1.f, grad_buffer(wi).f32(), C);
    });
  }
  return out;
}
}  // namespace

Tensor head_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets) {
  if (matmul_dtype() != DType::bf16 || !x.device().is_cpu()) return cross_entropy(linear_t(x, w), targets, true);
  detail::check_f32(x, "head_cross_entropy", "input");
  detail::check_f32(w, "head_cross_entropy", "weight");
  detail::check_i32(targets, "head_cross_entropy", "targets");
  ATOLL_CHECK(x.size(-1) == w.size(1), "head_cross_entropy: input {} does not match weight {}", shape_str(x.shape()),
              shape_str(w.shape()));
  ATOLL_CHECK(targets.numel() == detail::rows(x), "cross_entropy: {} targets for {} rows", targets.numel(),
              detail::rows(x));
  return head_loss_bf16(x, w, targets);
}

}  // namespace atl::ops
