#include "autograd/ops.h"

#include <cmath>

#include "autograd/linear_bf16.h"
#include "kernels/cpu/kernels.h"

namespace atl::ops {
namespace {

void check_f32(const Tensor& t, const char* op, const char* what) {
  ATOLL_CHECK(t.defined(), "{}: {} is undefined", op, what);
  ATOLL_CHECK(t.dtype() == DType::f32, "{}: {} must be f32, got {}", op, what, dtype_name(t.dtype()));
  ATOLL_CHECK(t.is_contiguous(), "{}: {} must be contiguous", op, what);
}

int64_t rows(const Tensor& x) { return x.numel() / x.size(-1); }

Shape with_last(const Shape& s, int64_t last) {
  Shape r = s;
  r.back() = last;
  return r;
}

float* grad_ptr(const Tensor& t) { return requires_grad(t) ? grad_buffer(t).f32() : nullptr; }

}  // namespace

Tensor embedding(const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  ATOLL_CHECK(tokens.dtype() == DType::i32 && tokens.dim() == 2, "embedding: tokens must be [B,T] i32");
  check_f32(wte, "embedding", "wte");
  int64_t B = tokens.size(0), T = tokens.size(1), V = wte.size(0), C = wte.size(1);
  const int32_t* tok = tokens.i32();
  for (int64_t i = 0; i < B * T; ++i)
    ATOLL_CHECK(tok[i] >= 0 && tok[i] < V, "embedding: token id {} at position {} is outside the vocabulary [0, {})",
                tok[i], i, V);
  if (wpe.defined()) {
    check_f32(wpe, "embedding", "wpe");
    ATOLL_CHECK(T <= wpe.size(0), "embedding: sequence length {} exceeds the {} learned positions", T, wpe.size(0));
  }
  Tensor out = Tensor::empty({B, T, C});
  cpu::embedding_forward(out.f32(), tok, wte.f32(), wpe.defined() ? wpe.f32() : nullptr, B, T, C);
  if (should_record({&wte, &wpe})) {
    record("embedding", out, {tokens, wte, wpe}, [B, T, C](Node& n) {
      const Tensor &tk = n.inputs[0], &e = n.inputs[1], &p = n.inputs[2];
      cpu::embedding_backward(grad_ptr(e), p.defined() ? grad_ptr(p) : nullptr, grad_of(n.output).f32(), tk.i32(), B,
                              T, C);
    });
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_f32(x, "linear", "input");
  check_f32(w, "linear", "weight");
  int64_t C = w.size(0), OC = w.size(1);
  ATOLL_CHECK(x.size(-1) == C, "linear: input {} does not match weight {}", shape_str(x.shape()), shape_str(w.shape()));
  if (b.defined()) ATOLL_CHECK(b.numel() == OC, "linear: bias of {} for {} outputs", b.numel(), OC);
  int64_t N = rows(x);
  if (matmul_dtype() == DType::bf16) return ops_bf16::linear(x, w, b, N, C, OC, with_last(x.shape(), OC));
  Tensor out = Tensor::empty(with_last(x.shape(), OC));
  cpu::linear_forward(out.f32(), x.f32(), w.f32(), b.defined() ? b.f32() : nullptr, N, C, OC);
  if (should_record({&x, &w, &b})) {
    record("linear", out, {x, w, b}, [N, C, OC](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1], &bi = n.inputs[2];
      cpu::linear_backward(grad_ptr(xi), grad_ptr(wi), bi.defined() ? grad_ptr(bi) : nullptr,
                           grad_of(n.output).f32(), xi.f32(), wi.f32(), N, C, OC);
    });
  }
  return out;
}

Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  check_f32(x, "layernorm", "input");
  check_f32(w, "layernorm", "weight");
  int64_t C = x.size(-1), N = rows(x);
  ATOLL_CHECK(w.numel() == C, "layernorm: weight of {} for {} features", w.numel(), C);
  Tensor out = Tensor::empty(x.shape()), mean = Tensor::empty({N}), rstd = Tensor::empty({N});
  cpu::layernorm_forward(out.f32(), mean.f32(), rstd.f32(), x.f32(), w.f32(), b.defined() ? b.f32() : nullptr, N, C,
                         eps);
  if (should_record({&x, &w, &b})) {
    record("layernorm", out, {x, w, b}, [N, C, mean, rstd](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1], &bi = n.inputs[2];
      cpu::layernorm_backward(grad_ptr(xi), grad_ptr(wi), bi.defined() ? grad_ptr(bi) : nullptr,
                              grad_of(n.output).f32(), xi.f32(), wi.f32(), mean.f32(), rstd.f32(), N, C);
    });
  }
  return out;
}

Tensor rmsnorm(const Tensor& x, const Tensor& w, float eps) {
  check_f32(x, "rmsnorm", "input");
  check_f32(w, "rmsnorm", "weight");
  int64_t C = x.size(-1), N = rows(x);
  ATOLL_CHECK(w.numel() == C, "rmsnorm: weight of {} for {} features", w.numel(), C);
  Tensor out = Tensor::empty(x.shape()), rstd = Tensor::empty({N});
  cpu::rmsnorm_forward(out.f32(), rstd.f32(), x.f32(), w.f32(), N, C, eps);
  if (should_record({&x, &w})) {
    record("rmsnorm", out, {x, w}, [N, C, rstd](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1];
      cpu::rmsnorm_backward(grad_ptr(xi), grad_ptr(wi), grad_of(n.output).f32(), xi.f32(), wi.f32(), rstd.f32(), N, C);
    });
  }
  return out;
}

Tensor gelu(const Tensor& x) {
  check_f32(x, "gelu", "input");
  Tensor out = Tensor::empty(x.shape());
  cpu::gelu_forward(out.f32(), x.f32(), x.numel());
  if (should_record({&x})) {
    record("gelu", out, {x}, [](Node& n) {
      const Tensor& xi = n.inputs[0];
      cpu::gelu_backward(grad_ptr(xi), grad_of(n.output).f32(), xi.f32(), xi.numel());
    });
  }
  return out;
}

Tensor swiglu(const Tensor& x) {
  check_f32(x, "swiglu", "input");
  ATOLL_CHECK(x.size(-1) % 2 == 0, "swiglu: last dim {} must be even ([gate | up])", x.size(-1));
  int64_t F = x.size(-1) / 2, N = rows(x);
  Tensor out = Tensor::empty(with_last(x.shape(), F));
  cpu::swiglu_forward(out.f32(), x.f32(), N, F);
  if (should_record({&x})) {
    record("swiglu", out, {x}, [N, F](Node& n) {
      const Tensor& xi = n.inputs[0];
      cpu::swiglu_backward(grad_ptr(xi), grad_of(n.output).f32(), xi.f32(), N, F);
    });
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  check_f32(a, "add", "a");
  check_f32(b, "add", "b");
  ATOLL_CHECK(a.shape() == b.shape(), "add: shapes {} and {}", shape_str(a.shape()), shape_str(b.shape()));
  Tensor out = Tensor::empty(a.shape());
  cpu::add_forward(out.f32(), a.f32(), b.f32(), a.numel());
  if (should_record({&a, &b})) {
    record("add", out, {a, b}, [](Node& n) {
      const Tensor& g = grad_of(n.output);
      for (auto& in : n.inputs)
        if (requires_grad(in)) cpu::add_inplace(grad_buffer(in).f32(), g.f32(), g.numel());
    });
  }
  return out;
}

Tensor rope(const Tensor& qkv, int64_t H, int64_t KV, int64_t hd, float theta, int64_t pos_offset) {
  check_f32(qkv, "rope", "qkv");
  ATOLL_CHECK(qkv.dim() == 3 && qkv.size(2) == (H + 2 * KV) * hd, "rope: qkv {} is not [B,T,(H+2KV)*hd]",
              shape_str(qkv.shape()));
  ATOLL_CHECK(hd % 2 == 0, "rope: head dim {} must be even", hd);
  int64_t B = qkv.size(0), T = qkv.size(1);
  Tensor out = Tensor::empty(qkv.shape());
  cpu::rope_forward(out.f32(), qkv.f32(), B, T, H, KV, hd, theta, pos_offset);
  if (should_record({&qkv})) {
    record("rope", out, {qkv}, [B, T, H, KV, hd, theta, pos_offset](Node& n) {
      cpu::rope_backward(grad_ptr(n.inputs[0]), grad_of(n.output).f32(), B, T, H, KV, hd, theta, pos_offset);
    });
  }
  return out;
}

Tensor attention(const Tensor& qkv, int64_t H, int64_t KV, int64_t hd) {
  check_f32(qkv, "attention", "qkv");
  ATOLL_CHECK(qkv.dim() == 3 && qkv.size(2) == (H + 2 * KV) * hd, "attention: qkv {} is not [B,T,(H+2KV)*hd]",
              shape_str(qkv.shape()));
  ATOLL_CHECK(KV > 0 && H % KV == 0, "attention: {} query heads not divisible by {} kv heads", H, KV);
  int64_t B = qkv.size(0), T = qkv.size(1);
  Tensor out = Tensor::empty({B, T, H * hd}), lse = Tensor::empty({B, H, T});
  cpu::attention_forward(out.f32(), lse.f32(), qkv.f32(), B, T, H, KV, hd);
  if (should_record({&qkv})) {
    record("attention", out, {qkv}, [B, T, H, KV, hd, out, lse](Node& n) {
      const Tensor& q = n.inputs[0];
      cpu::attention_backward(grad_ptr(q), grad_of(n.output).f32(), q.f32(), out.f32(), lse.f32(), B, T, H, KV, hd);
    });
  }
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, bool reuse_logits) {
  check_f32(logits, "cross_entropy", "logits");
  ATOLL_CHECK(targets.dtype() == DType::i32, "cross_entropy: targets must be i32");
  int64_t V = logits.size(-1), N = rows(logits);
  ATOLL_CHECK(targets.numel() == N, "cross_entropy: {} targets for {} rows", targets.numel(), N);
  const int32_t* tg = targets.i32();
  int64_t kept = 0;
  for (int64_t i = 0; i < N; ++i) {
    ATOLL_CHECK(tg[i] < V, "cross_entropy: target id {} at row {} is outside the vocabulary [0, {})", tg[i], i, V);
    kept += tg[i] >= 0;
  }
  Tensor losses = Tensor::empty({N}), lse = Tensor::empty({N});
  cpu::crossentropy_forward(losses.f32(), lse.f32(), logits.f32(), tg, N, V);
  double total = 0;
  const float* l = losses.f32();
  for (int64_t i = 0; i < N; ++i) total += l[i];
  Tensor out = Tensor::full({1}, kept ? float(total / double(kept)) : 0.f);
  if (should_record({&logits})) {
    record("cross_entropy", out, {logits, targets}, [N, V, kept, lse, reuse_logits](Node& n) {
      const Tensor& lg = n.inputs[0];
      if (!requires_grad(lg)) return;
      float g = grad_of(n.output).item() / float(kept ? kept : 1);
      Tensor dl = Tensor::full({N}, g);
      AutogradMeta& m = *lg.autograd();
      if (!m.grad.defined()) {
        // Nothing accumulated yet: the kernel may assign, into the logits themselves if allowed.
        m.grad = reuse_logits ? lg : Tensor::empty(lg.shape());
        cpu::crossentropy_backward(m.grad.f32(), dl.f32(), lg.f32(), lse.f32(), n.inputs[1].i32(), N, V);
      } else {
        Tensor tmp = Tensor::empty(lg.shape());
        cpu::crossentropy_backward(tmp.f32(), dl.f32(), lg.f32(), lse.f32(), n.inputs[1].i32(), N, V);
        cpu::add_inplace(m.grad.f32(), tmp.f32(), tmp.numel());
      }
    });
  }
  return out;
}

Tensor sum(const Tensor& x) {
  check_f32(x, "sum", "input");
  double s = 0;
  const float* p = x.f32();
  for (int64_t i = 0; i < x.numel(); ++i) s += p[i];
  Tensor out = Tensor::full({1}, float(s));
  if (should_record({&x})) {
    record("sum", out, {x}, [](Node& n) {
      const Tensor& xi = n.inputs[0];
      float g = grad_of(n.output).item();
      float* d = grad_buffer(xi).f32();
      for (int64_t i = 0; i < xi.numel(); ++i) d[i] += g;
    });
  }
  return out;
}

Tensor dot_const(const Tensor& x, const Tensor& c) {
  check_f32(x, "dot_const", "input");
  check_f32(c, "dot_const", "constant");
  ATOLL_CHECK(x.numel() == c.numel(), "dot_const: sizes {} and {}", x.numel(), c.numel());
  double s = 0;
  const float *p = x.f32(), *q = c.f32();
  for (int64_t i = 0; i < x.numel(); ++i) s += double(p[i]) * q[i];
  Tensor out = Tensor::full({1}, float(s));
  if (should_record({&x})) {
    record("dot_const", out, {x}, [c](Node& n) {
      const Tensor& xi = n.inputs[0];
      float g = grad_of(n.output).item();
      float* d = grad_buffer(xi).f32();
      const float* q = c.f32();
      for (int64_t i = 0; i < xi.numel(); ++i) d[i] += g * q[i];
    });
  }
  return out;
}

}  // namespace atl::ops

#include "kernels/cpu/gemm.h"

namespace atl::ops {

Tensor linear_t(const Tensor& x, const Tensor& w) {
  check_f32(x, "linear_t", "input");
  check_f32(w, "linear_t", "weight");
  int64_t OC = w.size(0), C = w.size(1), N = rows(x);
  ATOLL_CHECK(x.size(-1) == C, "linear_t: input {} does not match weight {}", shape_str(x.shape()), shape_str(w.shape()));
  if (matmul_dtype() == DType::bf16) return ops_bf16::linear_t(x, w, N, C, OC, with_last(x.shape(), OC));
  Tensor out = Tensor::empty(with_last(x.shape(), OC));
  cpu::gemm(false, true, N, OC, C, 1.f, x.f32(), C, w.f32(), C, 0.f, out.f32(), OC);
  if (should_record({&x, &w})) {
    record("linear_t", out, {x, w}, [N, C, OC](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1];
      const float* g = grad_of(n.output).f32();
      if (requires_grad(xi)) cpu::gemm(false, false, N, C, OC, 1.f, g, OC, wi.f32(), C, 1.f, grad_ptr(xi), C);
      if (requires_grad(wi)) cpu::gemm(true, false, OC, C, N, 1.f, g, OC, xi.f32(), C, 1.f, grad_ptr(wi), C);
    });
  }
  return out;
}

}  // namespace atl::ops
