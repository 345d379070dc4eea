#include "nn/context_attention.h"

#include <cstring>

#include "autograd/ops.h"

namespace atl::nn {

Tensor take_spans(const Tensor& x, const std::vector<Span>& spans) {
  ATOLL_CHECK(x.dim() >= 2 && x.is_contiguous(), "take_spans: want a contiguous [B, T, ...] tensor, got {}",
              shape_str(x.shape()));
  const int64_t B = x.size(0), T = x.size(1), row = x.numel() / (B * T) * int64_t(dtype_size(x.dtype()));
  int64_t Tl = 0;
  for (auto [s, n] : spans) {
    ATOLL_CHECK(s >= 0 && n >= 0 && s + n <= T, "take_spans: span [{}, {}) outside a row of {}", s, s + n, T);
    Tl += n;
  }
  Shape sh = x.shape();
  sh[1] = Tl;
  Tensor out = Tensor::empty(sh, x.dtype(), x.device());
  auto* src = static_cast<const char*>(x.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0;
    for (auto [s, n] : spans) {
      std::memcpy(dst + (b * Tl + t) * row, src + (b * T + s) * row, size_t(n * row));
      t += n;
    }
  }
  return out;
}

std::vector<int32_t> span_positions(const std::vector<Span>& spans) {
  std::vector<int32_t> p;
  for (auto [s, n] : spans)
    for (int64_t i = 0; i < n; ++i) p.push_back(int32_t(s + i));
  return p;
}

Tensor context_share_of_loss(const Tensor& loss, const Tensor& local_targets, const ContextAttention& cp) {
  ATOLL_CHECK(local_targets.dtype() == DType::i32, "context_share_of_loss: targets must be i32");
  int64_t kept = 0;
  for (int64_t i = 0; i < local_targets.numel(); ++i) kept += local_targets.i32()[i] >= 0;
  const double share = cp.loss_share(kept);
  return share == 1.0 ? loss : ops::mul(loss, Tensor::full({1}, float(share)));
}

}  // namespace atl::nn
