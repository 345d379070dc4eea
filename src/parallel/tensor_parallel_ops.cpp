// The autograd ops of tensor and sequence parallelism (the model-side calls of
// nn::TensorParallelContext), each a forward kernel plus one recorded node (atl::record) whose
// backward issues the conjugate collective on the tp communicator.
//
// Overlap: with sequence parallelism the token rows of an activation arrive by an all-gather; a
// linear's output rows depend only on the matching input rows, so the GEMM of this rank's own rows
// runs while the other ranks' rows are in flight and the rest follows the wait (the collective
// matmul decomposition of Wang et al., "Overlap Communication with Dependent Computation via
// Decomposition", ASPLOS 2023). In backward, the column-parallel linear starts the all-reduce
// (reduce-scatter under SP) of dx and computes dW while it runs (Megatron's async gradient
// all-reduce); the row-parallel linear's all-gather of dy overlaps the dx and dW GEMMs of the own
// rows. What cannot overlap: the row-parallel forward's reduction and the embedding's, whose
// results the next op needs whole.
#include <chrono>
#include <cmath>

#include "autograd/graph.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/kernel_util.h"
#include "parallel/tensor_parallel.h"

namespace atl::parallel {

namespace {

int64_t rows_of(const Tensor& x) { return x.numel() / x.size(-1); }
Shape with_last_dim(const Shape& s, int64_t last) {
  Shape o = s;
  o.back() = last;
  return o;
}

// y[rows, OUT] = a[rows, IN] · op(w) (+ b): op(w) = w [IN, OUT], or w^T for w [OUT, IN] (w_t).
void gemm_rows(const float* a, int64_t rows, int64_t IN, const Tensor& w, bool w_t, const float* b, float* y,
               int64_t OUT) {
  if (rows == 0) return;
  cpu::gemm(false, w_t, rows, OUT, IN, 1.f, a, IN, w.f32(), w_t ? IN : OUT, 0.f, y, OUT);
  if (b)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < OUT; ++j) y[i * OUT + j] += b[j];
}

// dx[rows, IN] = dy[rows, OUT] · op(w)^T
void gemm_dx(const float* dy, int64_t rows, int64_t OUT, const Tensor& w, bool w_t, float* dx, int64_t IN) {
  if (rows == 0) return;
  cpu::gemm(false, !w_t, rows, IN, OUT, 1.f, dy, OUT, w.f32(), w_t ? IN : OUT, 0.f, dx, IN);
}

// dW += x[rows, IN]^T · dy[rows, OUT] (or its transpose for w_t), accumulated.
void gemm_dw(const float* x, const float* dy, int64_t rows, int64_t IN, int64_t OUT, bool w_t, float* gw) {
  if (rows == 0) return;
  if (w_t) cpu::gemm(true, false, OUT, IN, rows, 1.f, dy, OUT, x, IN, 1.f, gw, IN);
  else cpu::gemm(true, false, IN, OUT, rows, 1.f, x, IN, dy, OUT, 1.f, gw, OUT);
}

void col_sum_into(float* g, const float* dy, int64_t rows, int64_t OUT) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < OUT; ++j) g[j] += dy[i * OUT + j];
}

void add_into(const Tensor& dst, const Tensor& src) {
  float* d = dst.f32();
  const float* s = src.f32();
  for (int64_t i = 0; i < src.numel(); ++i) d[i] += s[i];
}

void check_input(const Tensor& t, const char* op) {
  ATOLL_CHECK(t.dtype() == DType::f32 && t.is_contiguous() && t.device().is_cpu(),
              "{}: tensor-parallel ops take contiguous f32 CPU tensors", op);
}

// Column-parallel linear, shared by the MLP/attention input projections (w [IN, OUT_r]) and the
// vocab-parallel head (w_t: w [V_r, C]).
Tensor column(const TensorParallel& tp, const Tensor& x, const Tensor& w, const Tensor& b, bool w_t, const char* op) {
  check_input(x, op);
  check_input(w, op);
  const bool sp = tp.sequence_sharded();
  const int S = tp.size(), r = tp.rank();
  const int64_t IN = x.size(-1), OUT = w_t ? w.size(0) : w.size(1), n = rows_of(x), N = sp ? n * S : n;
  ATOLL_CHECK((w_t ? w.size(1) : w.size(0)) == IN, "{}: input [.., {}] against weight {}", op, IN, shape_str(w.shape()));
  ATOLL_CHECK(!sp || N == tp.B() * tp.T(), "{}: {} token rows on each of {} ranks for a [{}, {}] batch", op, n, S,
              tp.B(), tp.T());
  ATOLL_CHECK(!b.defined() || b.numel() == OUT, "{}: bias of {} for {} outputs", op, b.numel(), OUT);
  const float* bp = b.defined() ? b.f32() : nullptr;
  Tensor xf = x;
  Tensor y = sp ? Tensor::empty({tp.B(), tp.T(), OUT}) : Tensor::empty(with_last_dim(x.shape(), OUT));
  if (sp) {
    xf = Tensor::empty({N, IN});
    comm::WorkPtr wk = tp.comm()->all_gather_async(x, xf);
    tp.note(1, x.numel(), true);
    gemm_rows(x.f32(), n, IN, w, w_t, bp, y.f32() + int64_t(r) * n * OUT, OUT);  // while the others' rows arrive
    tp.wait(wk, true);
    for (int q = 0; q < S; ++q)
      if (q != r) gemm_rows(xf.f32() + int64_t(q) * n * IN, n, IN, w, w_t, bp, y.f32() + int64_t(q) * n * OUT, OUT);
  } else {
    gemm_rows(x.f32(), N, IN, w, w_t, bp, y.f32(), OUT);
  }
  if (should_record({&x, &w, &b})) {
    const TensorParallel* ctx = &tp;
    record(op, y, {x, w, b}, [ctx, xf, sp, S, n, N, IN, OUT, w_t](Node& nd) {
      const Tensor dy = grad_of(nd.output).contiguous();
      const Tensor &x = nd.inputs[0], &w = nd.inputs[1], &b = nd.inputs[2];
      comm::WorkPtr wk;
      Tensor dxf, dxs;
      const bool multi = S > 1;
      if (requires_grad(x)) {
        dxf = Tensor::empty({N, IN});
        gemm_dx(dy.f32(), N, OUT, w, w_t, dxf.f32(), IN);
        if (multi && sp) {
          dxs = Tensor::empty({n, IN});
          wk = ctx->comm()->reduce_scatter_async(dxf, dxs);
          ctx->note(2, dxs.numel(), true);
        } else if (multi) {
          wk = ctx->comm()->all_reduce_async(dxf);  // Megatron's f: identity forward, all-reduce backward
          ctx->note(0, dxf.numel(), true);
        }
      }
      // dW and db while dx is being reduced.
      if (requires_grad(w)) gemm_dw(xf.f32(), dy.f32(), N, IN, OUT, w_t, grad_buffer(w).f32());
      if (b.defined() && requires_grad(b)) col_sum_into(grad_buffer(b).f32(), dy.f32(), N, OUT);
      if (wk) ctx->wait(wk, true);
      if (requires_grad(x)) add_into(grad_buffer(x), multi && sp ? dxs : dxf);
    });
  }
  return y;
}

}  // namespace

Tensor TensorParallel::column_linear(const Tensor& x, const Tensor& w, const Tensor& b) const {
  return column(*this, x, w, b, false, "tp_column_linear");
}

Tensor TensorParallel::vocab_logits(const Tensor& h, const Tensor& head) const {
  return column(*this, h, head, Tensor(), true, "tp_vocab_logits");
}

Tensor TensorParallel::row_linear(const Tensor& x, const Tensor& w, const Tensor& b) const {
  const char* op = "tp_row_linear";
  check_input(x, op);
  check_input(w, op);
  const bool sp = sequence_sharded();
  const int S = size_, r = rank_;
  const int64_t IN = x.size(-1), OUT = w.size(1), N = rows_of(x), n = sp ? N / S : N;
  ATOLL_CHECK(w.size(0) == IN, "{}: input [.., {}] against weight {}", op, IN, shape_str(w.shape()));
  ATOLL_CHECK(!sp || N == B_ * T_, "{}: {} rows for a [{}, {}] batch", op, N, B_, T_);
  Tensor yp = Tensor::empty(with_last_dim(x.shape(), OUT));
  gemm_rows(x.f32(), N, IN, w, false, nullptr, yp.f32(), OUT);
  Tensor y = yp;
  if (S > 1 && sp) {  // sequence parallel: each rank keeps the sum of its own tokens' rows
    y = Tensor::empty({n, OUT});
    comm::WorkPtr wk = comm_->reduce_scatter_async(yp, y);
    note(2, y.numel());
    wait(wk);
  } else if (S > 1) {  // Megatron's g: all-reduce forward, identity backward
    comm::WorkPtr wk = comm_->all_reduce_async(yp);
    note(0, yp.numel());
    wait(wk);
  }
  // The bias once, after the sum (replicated; under SP each rank's gradient is its tokens' part).
  // (The pointers are taken once: fetched per element they cost ~2 ms a step at tp 2, perf.)
  if (b.defined()) {
    float* yd = y.f32();
    const float* bd = b.f32();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < OUT; ++j) yd[i * OUT + j] += bd[j];
  }
  if (should_record({&x, &w, &b})) {
    const TensorParallel* ctx = this;
    record(op, y, {x, w, b}, [ctx, sp, S, r, n, N, IN, OUT](Node& nd) {
      const Tensor dy = grad_of(nd.output).contiguous();
      const Tensor &x = nd.inputs[0], &w = nd.inputs[1], &b = nd.inputs[2];
      if (b.defined() && requires_grad(b)) col_sum_into(grad_buffer(b).f32(), dy.f32(), n, OUT);
      float* gx = requires_grad(x) ? grad_buffer(x).f32() : nullptr;
      float* gw = requires_grad(w) ? grad_buffer(w).f32() : nullptr;
      Tensor dx = gx ? Tensor::empty({N, IN}) : Tensor();
      auto chunk = [&](const float* dyc, int64_t row0, int64_t rows) {
        if (gx) gemm_dx(dyc, rows, OUT, w, false, dx.f32() + row0 * IN, IN);
        if (gw) gemm_dw(x.f32() + row0 * IN, dyc, rows, IN, OUT, false, gw);
      };
      if (S > 1 && sp) {
        Tensor dyf = Tensor::empty({N, OUT});
        comm::WorkPtr wk = ctx->comm()->all_gather_async(dy, dyf);
        ctx->note(1, dy.numel(), true);
        chunk(dy.f32(), int64_t(r) * n, n);  // this rank's rows while the others' arrive
        ctx->wait(wk, true);
        for (int q = 0; q < S; ++q)
          if (q != r) chunk(dyf.f32() + int64_t(q) * n * OUT, int64_t(q) * n, n);
      } else {
        chunk(dy.f32(), 0, N);
      }
      if (gx) add_into(grad_buffer(x), dx);
    });
  }
  return y;
}

Tensor TensorParallel::vocab_embedding(const Tensor& tokens, const Tensor& wte, int64_t lo, const Tensor& wpe) const {
  const char* op = "tp_vocab_embedding";
  ATOLL_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i32, "{}: tokens must be [B,T] i32", op);
  check_input(wte, op);
  const bool sp = sequence_sharded();
  const int S = size_, r = rank_;
  const int64_t B = tokens.size(0), T = tokens.size(1), N = B * T, n = sp ? N / S : N, C = wte.size(1),
                V = wte.size(0);
  ATOLL_CHECK(!wpe.defined() || (wpe.size(1) == C && wpe.size(0) >= T), "{}: position table {} for T = {}", op,
              shape_str(wpe.shape()), T);
  Tensor tok = tokens.contiguous().clone();  // the batch buffer is reused for the next batch
  Tensor part = Tensor::zeros({N, C});
  for (int64_t i = 0; i < N; ++i) {
    int64_t id = int64_t(tok.i32()[i]) - lo;
    if (id >= 0 && id < V) std::copy(wte.f32() + id * C, wte.f32() + (id + 1) * C, part.f32() + i * C);
  }
  Tensor y = sp ? Tensor::empty({n, C}) : part.view({B, T, C});
  if (S > 1 && sp) {
    comm::WorkPtr wk = comm_->reduce_scatter_async(part, y);
    note(2, y.numel());
    wait(wk);
  } else if (S > 1) {
    comm::WorkPtr wk = comm_->all_reduce_async(part);
    note(0, part.numel());
    wait(wk);
  }
  const int64_t row0 = sp ? int64_t(r) * n : 0;  // this rank's first token of the flattened batch
  if (wpe.defined())
    for (int64_t i = 0; i < n; ++i) {
      const float* p = wpe.f32() + ((row0 + i) % T) * C;
      for (int64_t c = 0; c < C; ++c) y.f32()[i * C + c] += p[c];
    }
  if (should_record({&wte, &wpe})) {
    const TensorParallel* ctx = this;
    record(op, y, {wte, wpe}, [ctx, tok, sp, S, n, N, C, V, T, lo, row0](Node& nd) {
      const Tensor dy = grad_of(nd.output).contiguous();
      const Tensor &wte = nd.inputs[0], &wpe = nd.inputs[1];
      Tensor dfull = dy;
      comm::WorkPtr wk;
      if (S > 1 && sp && requires_grad(wte)) {
        dfull = Tensor::empty({N, C});
        wk = ctx->comm()->all_gather_async(dy, dfull);
        ctx->note(1, dy.numel(), true);
      }
      if (wpe.defined() && requires_grad(wpe)) {  // overlaps the gather
        float* g = grad_buffer(wpe).f32();
        for (int64_t i = 0; i < n; ++i)
          for (int64_t c = 0; c < C; ++c) g[((row0 + i) % T) * C + c] += dy.f32()[i * C + c];
      }
      if (wk) ctx->wait(wk, true);
      if (requires_grad(wte)) {
        float* g = grad_buffer(wte).f32();
        for (int64_t i = 0; i < N; ++i) {
          int64_t id = int64_t(tok.i32()[i]) - lo;
          if (id >= 0 && id < V)
            for (int64_t c = 0; c < C; ++c) g[id * C + c] += dfull.f32()[i * C + c];
        }
      }
    });
  }
  return y;
}

Tensor TensorParallel::vocab_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t lo) const {
  const char* op = "tp_vocab_cross_entropy";
  check_input(logits, op);
  ATOLL_CHECK(targets.dtype() == DType::i32, "{}: targets must be i32", op);
  const int64_t V = logits.size(-1), N = rows_of(logits);
  ATOLL_CHECK(targets.numel() == N, "{}: {} targets for {} rows", op, targets.numel(), N);
  Tensor tg = targets.contiguous().clone();
  const float* x = logits.f32();
  const int32_t* t = tg.i32();
  int64_t kept = 0;
  for (int64_t i = 0; i < N; ++i) kept += t[i] >= 0;
  // The row max over the whole vocabulary, then the sum of exponentials and the target's logit
  // (0 on the ranks that do not own it) in one all-reduce.
  Tensor mx = Tensor::empty({N});
  for (int64_t i = 0; i < N; ++i) {
    float m = -INFINITY;
    for (int64_t v = 0; v < V; ++v) m = x[i * V + v] > m ? x[i * V + v] : m;
    mx.f32()[i] = m;
  }
  if (size_ > 1) {
    note(0, N);
    wait(comm_->all_reduce_async(mx, comm::ReduceOp::max));
  }
  Tensor st = Tensor::empty({2, N});
  float *se = st.f32(), *tl = st.f32() + N;
  for (int64_t i = 0; i < N; ++i) {
    float m = mx.f32()[i], s = 0.f;
    for (int64_t v = 0; v < V; ++v) s += cpu::detail::exp_approx(x[i * V + v] - m);
    se[i] = s;
    int64_t id = int64_t(t[i]) - lo;
    tl[i] = id >= 0 && id < V ? x[i * V + id] : 0.f;
  }
  if (size_ > 1) {
    note(0, st.numel());
    wait(comm_->all_reduce_async(st));
  }
  Tensor lse = Tensor::empty({N});
  double total = 0;
  for (int64_t i = 0; i < N; ++i) {
    lse.f32()[i] = mx.f32()[i] + std::log(se[i]);
    if (t[i] >= 0) total += double(lse.f32()[i] - tl[i]);
  }
  Tensor out = Tensor::full({1}, kept ? float(total / double(kept)) : 0.f);
  if (should_record({&logits})) {
    record(op, out, {logits}, [tg, lse, kept, N, V, lo](Node& nd) {
      const Tensor& lg = nd.inputs[0];
      if (!requires_grad(lg)) return;
      const float g = grad_of(nd.output).item() / float(kept ? kept : 1);
      float* d = grad_buffer(lg).f32();
      const float* x = lg.f32();
      for (int64_t i = 0; i < N; ++i) {
        const int32_t tt = tg.i32()[i];
        if (tt < 0) continue;
        const float l = lse.f32()[i];
        for (int64_t v = 0; v < V; ++v) d[i * V + v] += cpu::detail::exp_approx(x[i * V + v] - l) * g;
        int64_t id = int64_t(tt) - lo;
        if (id >= 0 && id < V) d[i * V + id] -= g;
      }
    });
  }
  return out;
}

Tensor TensorParallel::gather_vocab(const Tensor& logits, int64_t V) const {
  const int64_t Vr = logits.size(-1), N = rows_of(logits);
  if (size_ == 1) return logits.contiguous().view({N, V});
  int64_t vmax = 0;
  for (int q = 0; q < size_; ++q) {
    auto [a, z] = nn::shard_range(V, q, size_);
    vmax = std::max(vmax, z - a);
  }
  Tensor pad = Tensor::zeros({N, vmax}), all = Tensor::empty({int64_t(size_), N, vmax});
  pad.slice(1, 0, Vr).copy_from(logits.contiguous().view({N, Vr}));
  comm_->all_gather(pad, all);
  Tensor out = Tensor::empty({N, V});
  for (int q = 0; q < size_; ++q) {
    auto [a, z] = nn::shard_range(V, q, size_);
    out.slice(1, a, z).copy_from(all.select(0, q).slice(1, 0, z - a));
  }
  return out;
}

}  // namespace atl::parallel
