// Autograd ops of mixture-of-experts layers: the grouped linear over tokens sorted by expert, the
// router's sigmoid and weight renormalisation, and a differentiable reshape (tokens [B,T,C] as
// rows [B*T, C] for the index ops).
#include "autograd/ops.h"
#include "autograd/ops_util.h"

namespace atl::ops {

using namespace detail;

Tensor grouped_linear(const Tensor& x, const Tensor& w, const std::vector<int64_t>& offsets, int64_t first) {
  check_f32(x, "grouped_linear", "input");
  check_f32(w, "grouped_linear", "weight");
  check_same_device(x, w, "grouped_linear");
  ATOLL_CHECK(x.dim() == 2 && w.dim() == 3, "grouped_linear: input {} must be [M,K] and weight {} [G,K,N]",
              shape_str(x.shape()), shape_str(w.shape()));
  const int64_t G = int64_t(offsets.size()) - 1, Kd = w.size(1), N = w.size(2), M = x.size(0);
  ATOLL_CHECK(G >= 0 && first >= 0 && first + G <= w.size(0), "grouped_linear: groups {}..{} of a weight {}", first,
              first + G, shape_str(w.shape()));
  ATOLL_CHECK(x.size(1) == Kd, "grouped_linear: input {} does not match weight {}", shape_str(x.shape()),
              shape_str(w.shape()));
  ATOLL_CHECK(offsets.front() == 0 && offsets.back() == M, "grouped_linear: offsets must run from 0 to {} rows", M);
  for (int64_t g = 0; g < G; ++g)
    ATOLL_CHECK(offsets[size_t(g)] <= offsets[size_t(g + 1)], "grouped_linear: offsets decrease at group {}", g);
  Tensor y = empty_like_dev({M, N}, x);
  const kernels::KernelTable& kt = K(x);
  ATOLL_CHECK(kt.moe.grouped_forward, "grouped_linear: no grouped-GEMM kernel on {}", kt.name);
  kt.moe.grouped_forward(y.f32(), x.f32(), w.f32() + first * Kd * N, offsets.data(), G, Kd, N);
  if (should_record({&x, &w})) {
    record("grouped_linear", y, {x, w}, [offsets, first, G, Kd, N](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1];
      float* dw = grad_ptr(wi);
      K(xi).moe.grouped_backward(grad_ptr(xi), dw ? dw + first * Kd * N : nullptr, grad_of(n.output).f32(), xi.f32(),
                                 wi.f32() + first * Kd * N,
                                 offsets.data(), G, Kd, N);
    });
  }
  return y;
}

Tensor sigmoid(const Tensor& x) {
  check_f32(x, "sigmoid", "input");
  Tensor y = empty_like_dev(x.shape(), x);
  K(x).moe.sigmoid_forward(y.f32(), x.f32(), x.numel());
  if (should_record({&x})) {
    record("sigmoid", y, {x}, [yv = Tensor(y)](Node& n) {  // the node keeps only a handle of y (graph.cpp)
      const Tensor& xi = n.inputs[0];
      K(xi).moe.sigmoid_backward(grad_ptr(xi), grad_of(n.output).f32(), yv.f32(), xi.numel());
    });
  }
  return y;
}

Tensor normalize_rows(const Tensor& x) {
  check_f32(x, "normalize_rows", "input");
  const int64_t N = rows(x), C = x.size(-1);
  Tensor y = empty_like_dev(x.shape(), x);
  K(x).moe.normalize_rows_forward(y.f32(), x.f32(), N, C);
  if (should_record({&x})) {
    record("normalize_rows", y, {x}, [N, C](Node& n) {
      const Tensor& xi = n.inputs[0];
      K(xi).moe.normalize_rows_backward(grad_ptr(xi), grad_of(n.output).f32(), xi.f32(), N, C);
    });
  }
  return y;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  ATOLL_CHECK(x.defined() && x.is_contiguous(), "reshape: input must be defined and contiguous");
  Tensor y = x.view(shape);
  if (should_record({&x})) {
    record("reshape", y, {x}, [](Node& n) {
      const Tensor& xi = n.inputs[0];
      if (!requires_grad(xi)) return;
      K(xi).elem.add_inplace(grad_buffer(xi).f32(), grad_of(n.output).f32(), xi.numel());
    });
  }
  return y;
}

}  // namespace atl::ops
