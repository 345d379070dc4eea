// The bf16 form of ops::attention (attention_bf16.h). Like linear_bf16.cpp, the node's input is a
// stand-in carrying qkv's autograd record over the bf16 copy's storage, so the fp32 qkv is freed
// after forward and its gradient still accumulates where it belongs.
#include "autograd/attention_bf16.h"

#include <cstdlib>
#include <cstring>

#include "autograd/bf16_handoff.h"
#include "autograd/precision.h"
#include "kernels/cpu/attention_bf16.h"

namespace atl::ops_bf16 {

bool attention_applies(const Tensor& qkv, int64_t H, int64_t KV) {
  // ATOLL_ATTENTION_BF16=0 keeps the fp32 kernels in bf16 mode (for A/B comparisons).
  static const bool off = [] {
    const char* e = std::getenv("ATOLL_ATTENTION_BF16");
    return e && std::strcmp(e, "0") == 0;
  }();
  return !off && matmul_dtype() == DType::bf16 && qkv.device().is_cpu() && KV == H && cpu::attention_bf16_supported();
}

Tensor attention(const Tensor& qkv, int64_t H, int64_t hd) {
  const int64_t B = qkv.size(0), T = qkv.size(1);
  Tensor packed = Tensor::empty(qkv.shape(), DType::bf16);  // [3][B·H][T][hd] inside qkv's shape
  cpu::attention_bf16_pack(packed.data<bf16>(), qkv.f32(), B, T, H, hd);
  Tensor out = Tensor::empty({B, T, H * hd}), lse = Tensor::empty({B, H, T});
  const bool rec = should_record({&qkv}), hand_off = rec && bf16_handoff::enabled();
  Tensor out_b = hand_off ? Tensor::empty({B, T, H * hd}, DType::bf16) : Tensor();
  cpu::attention_bf16_forward(out.f32(), lse.f32(), packed.data<bf16>(), B, T, H, hd,
                              hand_off ? out_b.data<bf16>() : nullptr);
  if (rec) {
    Tensor in = packed;
    in.set_autograd(qkv.autograd());
    record("attention_bf16", out, {in}, [B, T, H, hd, packed, lse](Node& n) {
      const Tensor& q = n.inputs[0];
      if (!requires_grad(q)) return;
      bool fresh;
      float* g = grad_buffer_for_write(q, &fresh).f32();
      cpu::attention_bf16_backward(g, grad_of(n.output).f32(), packed.data<bf16>(), lse.f32(), B, T, H, hd, !fresh);
    });
    if (hand_off) bf16_handoff::offer_output(out, std::move(out_b));  // the output projection's input
  }
  return out;
}

}  // namespace atl::ops_bf16
