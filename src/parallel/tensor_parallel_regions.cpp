// Megatron-LM's conjugate region operators as autograd ops on their own (Shoeybi et al. 2019,
// section 3: f and g; Korthikanti et al. 2022, section 4.2.2: their sequence-parallel forms):
//   f  copy_to_region        identity forward, all-reduce backward
//   g  reduce_from_region    all-reduce forward, identity backward
//   gather_sequence          all-gather of token rows forward, reduce-scatter backward
//   scatter_sequence         reduce-scatter forward, all-gather backward
// The model's linears use fused forms of these (tensor_parallel_ops.cpp, which overlap the
// collective with the GEMM); these are the unfused definitions, for composing other layers and
// for checking the fused ones against.
#include "autograd/graph.h"
#include "parallel/tensor_parallel.h"

namespace atl::parallel {

namespace {
void accumulate(const Tensor& into_of, const Tensor& g) {
  if (!requires_grad(into_of)) return;
  float* d = grad_buffer(into_of).f32();
  for (int64_t i = 0; i < g.numel(); ++i) d[i] += g.f32()[i];
}
int64_t rows_of(const Tensor& x) { return x.numel() / x.size(-1); }
}  // namespace

Tensor TensorParallel::copy_to_region(const Tensor& x) const {
  Tensor y = x.contiguous().clone();
  if (should_record({&x})) {
    const TensorParallel* ctx = this;
    record("tp_copy_to_region", y, {x}, [ctx](Node& n) {
      Tensor g = grad_of(n.output).contiguous().clone();
      if (ctx->comm()) ctx->wait(ctx->comm()->all_reduce_async(g));
      accumulate(n.inputs[0], g);
    });
  }
  return y;
}

Tensor TensorParallel::reduce_from_region(const Tensor& x) const {
  Tensor y = x.contiguous().clone();
  if (comm_) wait(comm_->all_reduce_async(y));
  if (should_record({&x})) record("tp_reduce_from_region", y, {x}, [](Node& n) {
      accumulate(n.inputs[0], grad_of(n.output).contiguous());
    });
  return y;
}

Tensor TensorParallel::gather_sequence(const Tensor& x) const {
  const int64_t n = rows_of(x), C = x.size(-1);
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty({n * size_, C});
  if (comm_) wait(comm_->all_gather_async(xc, y));
  else y.copy_from(xc.view({n, C}));
  if (should_record({&x})) {
    const TensorParallel* ctx = this;
    record("tp_gather_sequence", y, {x}, [ctx, n, C](Node& nd) {
      Tensor g = grad_of(nd.output).contiguous(), mine = Tensor::empty({n, C});
      if (ctx->comm()) ctx->wait(ctx->comm()->reduce_scatter_async(g, mine));
      else mine.copy_from(g);
      accumulate(nd.inputs[0], mine);
    });
  }
  return y;
}

Tensor TensorParallel::scatter_sequence(const Tensor& x) const {
  const int64_t N = rows_of(x), C = x.size(-1);
  ATOLL_CHECK(N % size_ == 0, "scatter_sequence: {} rows over {} ranks", N, size_);
  Tensor xc = x.contiguous();
  Tensor y = Tensor::empty({N / size_, C});
  if (comm_) wait(comm_->reduce_scatter_async(xc, y));
  else y.copy_from(xc.view({N, C}));
  if (should_record({&x})) {
    const TensorParallel* ctx = this;
    record("tp_scatter_sequence", y, {x}, [ctx, N, C](Node& nd) {
      Tensor g = grad_of(nd.output).contiguous(), all = Tensor::empty({N, C});
      if (ctx->comm()) ctx->wait(ctx->comm()->all_gather_async(g, all));
      else all.copy_from(g);
      accumulate(nd.inputs[0], all);
    });
  }
  return y;
}

}  // namespace atl::parallel
