// Autograd ops for batched matmul, softmax, broadcast multiply, mean-squared error and dropout;
// their kernels come from the dispatch table (kernels/dispatch.h).
#include "autograd/ops.h"
#include "autograd/ops_util.h"
#include "kernels/dropout_mask.h"

namespace atl::ops {

using namespace detail;

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_f32(a, "bmm", "a");
  check_f32(b, "bmm", "b");
  check_same_device(a, b, "bmm");
  ATOLL_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) && a.size(2) == b.size(1),
              "bmm: shapes {} and {} are not [B,M,K] and [B,K,N]", shape_str(a.shape()), shape_str(b.shape()));
  const int64_t Bt = a.size(0), M = a.size(1), Kd = a.size(2), N = b.size(2);
  Tensor out = empty_like_dev({Bt, M, N}, a);
  K(a).gemm.bmm_forward(out.f32(), a.f32(), b.f32(), Bt, M, Kd, N);
  if (should_record({&a, &b})) {
    record("bmm", out, {a, b}, [Bt, M, Kd, N](Node& n) {
      const Tensor &ai = n.inputs[0], &bi = n.inputs[1];
      K(ai).gemm.bmm_backward(grad_ptr(ai), grad_ptr(bi), grad_of(n.output).f32(), ai.f32(), bi.f32(), Bt, M, Kd, N);
    });
  }
  return out;
}

namespace {

Tensor softmax_impl(const Tensor& x, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  check_f32(x, op, "input");
  const int64_t C = x.size(-1), N = rows(x);
  Tensor out = empty_like_dev(x.shape(), x);
  K(x).softmax.forward(out.f32(), x.f32(), N, C, log);
  if (should_record({&x})) {
    record(op, out, {x}, [N, C, log, out](Node& n) {
      const Tensor& xi = n.inputs[0];
      K(xi).softmax.backward(grad_ptr(xi), grad_of(n.output).f32(), out.f32(), N, C, log);
    });
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x) { return softmax_impl(x, false); }
Tensor log_softmax(const Tensor& x) { return softmax_impl(x, true); }

Tensor mul(const Tensor& a, const Tensor& b) {
  check_f32(a, "mul", "a");
  check_f32(b, "mul", "b");
  check_same_device(a, b, "mul");
  Shape shape;
  kernels::Broadcast bc;
  ATOLL_CHECK(kernels::broadcast_shapes(a.shape(), b.shape(), &shape, &bc),
              "mul: shapes {} and {} do not broadcast (or need more than {} merged dims)", shape_str(a.shape()),
              shape_str(b.shape()), kernels::kMaxBroadcastDims);
  Tensor out = empty_like_dev(shape, a);
  K(a).elem.mul_forward(out.f32(), a.f32(), b.f32(), bc);
  if (should_record({&a, &b})) {
    record("mul", out, {a, b}, [bc](Node& n) {
      const Tensor &ai = n.inputs[0], &bi = n.inputs[1];
      K(ai).elem.mul_backward(grad_ptr(ai), grad_ptr(bi), grad_of(n.output).f32(), ai.f32(), bi.f32(), bc);
    });
  }
  return out;
}

Tensor mse_loss(const Tensor& pred, const Tensor& target) {
  check_f32(pred, "mse_loss", "pred");
  check_f32(target, "mse_loss", "target");
  check_same_device(pred, target, "mse_loss");
  ATOLL_CHECK(pred.shape() == target.shape(), "mse_loss: pred {} and target {} differ in shape",
              shape_str(pred.shape()), shape_str(target.shape()));
  const int64_t n = pred.numel();
  ATOLL_CHECK(n > 0, "mse_loss: empty input");
  Tensor out = Tensor::full({1}, float(K(pred).reduce.sq_diff_sum(pred.f32(), target.f32(), n) / double(n)));
  if (should_record({&pred, &target})) {
    record("mse_loss", out, {pred, target}, [n](Node& n_) {
      const Tensor &p = n_.inputs[0], &t = n_.inputs[1];
      const float g = float(2.0 * grad_of(n_.output).item() / double(n));
      K(p).reduce.sq_diff_backward(grad_ptr(p), grad_ptr(t), p.f32(), t.f32(), n, g);
    });
  }
  return out;
}

Tensor dropout(const Tensor& x, float p, const DropoutKey& key) {
  check_f32(x, "dropout", "input");
  ATOLL_CHECK(p >= 0.0f && p < 1.0f, "dropout: p = {} is outside [0, 1)", p);
  const uint64_t k = kernels::dropout_key(key.seed, key.rank, key.step, key.site);
  Tensor out = empty_like_dev(x.shape(), x);
  K(x).elem.dropout_forward(out.f32(), x.f32(), x.numel(), p, k);
  if (should_record({&x})) {
    record("dropout", out, {x}, [p, k](Node& n) {
      const Tensor& xi = n.inputs[0];
      K(xi).elem.dropout_backward(grad_ptr(xi), grad_of(n.output).f32(), xi.numel(), p, k);
    });
  }
  return out;
}

}  // namespace atl::ops
