// bf16-mode layer norm (norm_bf16.h). Rounding the input x itself to bf16 would not be safe: x̂ =
// (x − μ)·rstd cancels the leading bits wherever |μ| is large against σ, so x's rounding error,
// relative to |x|, becomes large relative to x̂. Rounding x̂ instead costs 2^-9 relative in x̂
// whatever μ is. Backward rebuilds x = x̂/rstd + μ in fp32 (whose own rounding, ~2^-24·|μ|/σ, is far
// below bf16's) and runs the fp32 kernel, which recomputes (x − μ)·rstd ≈ x̂. The node keeps half
// the bytes: the residual stream a block's norms read is saved by nothing else, so its fp32 copy
// is freed during forward.
#include "autograd/norm_bf16.h"

#include "autograd/bf16_handoff.h"
#include "autograd/ops_util.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernel_util.h"

#include <algorithm>

namespace atl::ops_bf16 {
namespace {
using ops::detail::K;
}  // namespace

Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  const int64_t C = x.size(-1), N = ops::detail::rows(x);
  Tensor out = Tensor::empty(x.shape()), mean = Tensor::empty({N}), rstd = Tensor::empty({N});
  const float *wp = w.f32(), *bp = b.defined() ? b.f32() : nullptr;
  if (!should_record({&x, &w, &b})) {
    K(x).norm.layernorm_forward(out.f32(), mean.f32(), rstd.f32(), x.f32(), wp, bp, N, C, eps);
    return out;
  }
  // Rows in blocks of kRows: the fp32 kernel normalises a block (its rows are independent, so these
  // are its bits for the whole tensor; inside this parallel loop it runs on one thread), then, while
  // the block is in cache, x̂ and the output are rounded to bf16: the output's copy is what the next
  // linear reads (bf16_handoff.h), no separate pass over it.
  constexpr int64_t kRows = 8;
  const bool hand_off = bf16_handoff::enabled();
  Tensor xhat = Tensor::empty(x.shape(), DType::bf16), out_b;
  if (hand_off) out_b = Tensor::empty(x.shape(), DType::bf16);
  {
    const float* xp = x.f32();
    float *op = out.f32(), *mp = mean.f32(), *rp = rstd.f32();
    bf16 *hp = xhat.data<bf16>(), *obp = hand_off ? out_b.data<bf16>() : nullptr;
    const auto& ln = K(x).norm;
#pragma omp parallel for schedule(static) if(parallel : N * C >= cpu::detail::kMinParallelWork)
    for (int64_t i0 = 0; i0 < N; i0 += kRows) {
      const int64_t r = std::min(kRows, N - i0);
      ln.layernorm_forward(op + i0 * C, mp + i0, rp + i0, xp + i0 * C, wp, bp, r, C, eps);
      if (obp) cpu::f32_to_bf16(op + i0 * C, obp + i0 * C, r * C);
      for (int64_t i = i0; i < i0 + r; ++i) {
        float row[1024];
        for (int64_t c0 = 0; c0 < C; c0 += 1024) {
          const int64_t n = std::min<int64_t>(1024, C - c0);
#pragma omp simd
          for (int64_t c = 0; c < n; ++c) row[c] = (xp[i * C + c0 + c] - mp[i]) * rp[i];
          cpu::f32_to_bf16(row, hp + i * C + c0, n);
        }
      }
    }
  }
  xhat.set_autograd(x.autograd());  // the saved x̂ stands in for x: its gradient accumulates in x's
  record("layernorm_bf16", out, {xhat, w, b}, [N, C, mean, rstd](Node& n) {
    const Tensor &xi = n.inputs[0], &wi = n.inputs[1], &bi = n.inputs[2];
    Tensor xr = Tensor::empty(xi.shape());
    float* r = xr.f32();
    const bf16* h = xi.data<bf16>();
    const float *mp = mean.f32(), *rp = rstd.f32();
    cpu::bf16_to_f32(h, r, xi.numel());
#pragma omp parallel for schedule(static) if(parallel : N * C >= cpu::detail::kMinParallelWork)
    for (int64_t i = 0; i < N; ++i) {
      const float sigma = 1.0f / rp[i];
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) r[i * C + c] = r[i * C + c] * sigma + mp[i];
    }
    K(xr).norm.layernorm_backward(ops::detail::grad_ptr(xi), ops::detail::grad_ptr(wi),
                                  bi.defined() ? ops::detail::grad_ptr(bi) : nullptr, grad_of(n.output).f32(), r,
                                  wi.f32(), mp, rp, N, C);
  });
  if (hand_off) bf16_handoff::offer_output(out, std::move(out_b));
  return out;
}

}  // namespace atl::ops_bf16
