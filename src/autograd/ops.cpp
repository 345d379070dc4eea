#include "autograd/ops.h"

#include <cmath>

#include "autograd/activations_bf16.h"
#include "autograd/attention_bf16.h"
#include "autograd/linear_bf16.h"
#include "autograd/norm_bf16.h"
#include "autograd/ops_util.h"

namespace atl::ops {

using namespace detail;

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
  Tensor out = empty_like_dev({B, T, C}, wte);
  K(wte).embedding.forward(out.f32(), tok, wte.f32(), wpe.defined() ? wpe.f32() : nullptr, B, T, C);
  if (should_record({&wte, &wpe})) {
    record("embedding", out, {tokens, wte, wpe}, [B, T, C](Node& n) {
      const Tensor &tk = n.inputs[0], &e = n.inputs[1], &p = n.inputs[2];
      K(e).embedding.backward(grad_ptr(e), p.defined() ? grad_ptr(p) : nullptr, grad_of(n.output).f32(), tk.i32(), B,
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
  Tensor out = empty_like_dev(with_last(x.shape(), OC), x);
  K(x).linear.forward(out.f32(), x.f32(), w.f32(), b.defined() ? b.f32() : nullptr, N, C, OC);
  if (should_record({&x, &w, &b})) {
    record("linear", out, {x, w, b}, [N, C, OC](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1], &bi = n.inputs[2];
      Tensor g = grad_of(n.output);
      // Weight and bias gradients, deferrable for zero-bubble schedules (graph.h).
      std::function<void()> dw = [xi, wi, bi, g, N, C, OC] {
        K(xi).linear.backward(nullptr, grad_ptr(wi), bi.defined() ? grad_ptr(bi) : nullptr, g.f32(), xi.f32(),
                              wi.f32(), N, C, OC);
      };
      if (!(requires_grad(wi) || (bi.defined() && requires_grad(bi))) || defer_weight_grad(dw)) {
        K(xi).linear.backward(grad_ptr(xi), nullptr, nullptr, g.f32(), xi.f32(), wi.f32(), N, C, OC);
      } else {
        K(xi).linear.backward(grad_ptr(xi), grad_ptr(wi), bi.defined() ? grad_ptr(bi) : nullptr, g.f32(), xi.f32(),
                              wi.f32(), N, C, OC);
      }
    });
  }
  return out;
}

Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  check_f32(x, "layernorm", "input");
  check_f32(w, "layernorm", "weight");
  int64_t C = x.size(-1), N = rows(x);
  ATOLL_CHECK(w.numel() == C, "layernorm: weight of {} for {} features", w.numel(), C);
  if (matmul_dtype() == DType::bf16 && x.device().is_cpu()) return ops_bf16::layernorm(x, w, b, eps);  // saves bf16 x̂
  Tensor out = empty_like_dev(x.shape(), x), mean = empty_like_dev({N}, x), rstd = empty_like_dev({N}, x);
  K(x).norm.layernorm_forward(out.f32(), mean.f32(), rstd.f32(), x.f32(), w.f32(), b.defined() ? b.f32() : nullptr, N, C,
                         eps);
  if (should_record({&x, &w, &b})) {
    record("layernorm", out, {x, w, b}, [N, C, mean, rstd](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1], &bi = n.inputs[2];
      K(xi).norm.layernorm_backward(grad_ptr(xi), grad_ptr(wi), bi.defined() ? grad_ptr(bi) : nullptr,
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
  Tensor out = empty_like_dev(x.shape(), x), rstd = empty_like_dev({N}, x);
  K(x).norm.rmsnorm_forward(out.f32(), rstd.f32(), x.f32(), w.f32(), N, C, eps);
  if (should_record({&x, &w})) {
    record("rmsnorm", out, {x, w}, [N, C, rstd](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1];
      K(xi).norm.rmsnorm_backward(grad_ptr(xi), grad_ptr(wi), grad_of(n.output).f32(), xi.f32(), wi.f32(), rstd.f32(), N, C);
    });
  }
  return out;
}

Tensor gelu(const Tensor& x) {
  check_f32(x, "gelu", "input");
  if (matmul_dtype() == DType::bf16 && x.device().is_cpu()) return ops_bf16::gelu(x);  // saves bf16
  Tensor out = empty_like_dev(x.shape(), x);
  K(x).act.gelu_forward(out.f32(), x.f32(), x.numel());
  if (should_record({&x})) {
    record("gelu", out, {x}, [](Node& n) {
      const Tensor& xi = n.inputs[0];
      K(xi).act.gelu_backward(grad_ptr(xi), grad_of(n.output).f32(), xi.f32(), xi.numel());
    });
  }
  return out;
}

Tensor swiglu(const Tensor& x) {
  check_f32(x, "swiglu", "input");
  ATOLL_CHECK(x.size(-1) % 2 == 0, "swiglu: last dim {} must be even ([gate | up])", x.size(-1));
  if (matmul_dtype() == DType::bf16 && x.device().is_cpu()) return ops_bf16::swiglu(x);  // saves bf16
  int64_t F = x.size(-1) / 2, N = rows(x);
  Tensor out = empty_like_dev(with_last(x.shape(), F), x);
  K(x).act.swiglu_forward(out.f32(), x.f32(), N, F);
  if (should_record({&x})) {
    record("swiglu", out, {x}, [N, F](Node& n) {
      const Tensor& xi = n.inputs[0];
      K(xi).act.swiglu_backward(grad_ptr(xi), grad_of(n.output).f32(), xi.f32(), N, F);
    });
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  check_f32(a, "add", "a");
  check_f32(b, "add", "b");
  ATOLL_CHECK(a.shape() == b.shape(), "add: shapes {} and {}", shape_str(a.shape()), shape_str(b.shape()));
  Tensor out = empty_like_dev(a.shape(), a);
  K(a).elem.add_forward(out.f32(), a.f32(), b.f32(), a.numel());
  if (should_record({&a, &b})) {
    record("add", out, {grad_handle(a), grad_handle(b)}, [](Node& n) {
      const Tensor& g = grad_of(n.output);
      for (auto& in : n.inputs) {
        if (!requires_grad(in)) continue;
        if (!g.device().is_cpu()) {
          K(g).elem.add_inplace(grad_buffer(in).f32(), g.f32(), g.numel());
          continue;
        }
        bool fresh;
        Tensor& gi = grad_buffer_for_write(in, &fresh);
        if (fresh) gi.copy_from(g);  // one pass instead of zeroing and adding
        else K(g).elem.add_inplace(gi.f32(), g.f32(), g.numel());
      }
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
  Tensor out = empty_like_dev(qkv.shape(), qkv);
  K(qkv).rope.forward(out.f32(), qkv.f32(), B, T, H, KV, hd, theta, pos_offset);
  if (should_record({&qkv})) {
    record("rope", out, {qkv}, [B, T, H, KV, hd, theta, pos_offset](Node& n) {
      K(n.inputs[0]).rope.backward(grad_ptr(n.inputs[0]), grad_of(n.output).f32(), B, T, H, KV, hd, theta, pos_offset);
    });
  }
  return out;
}

Tensor attention(const Tensor& qkv, int64_t H, int64_t KV, int64_t hd) {
  check_f32(qkv, "attention", "qkv");
  ATOLL_CHECK(qkv.dim() == 3 && qkv.size(2) == (H + 2 * KV) * hd, "attention: qkv {} is not [B,T,(H+2KV)*hd]",
              shape_str(qkv.shape()));
  ATOLL_CHECK(KV > 0 && H % KV == 0, "attention: {} query heads not divisible by {} kv heads", H, KV);
  if (ops_bf16::attention_applies(qkv, H, KV)) return ops_bf16::attention(qkv, H, hd);
  int64_t B = qkv.size(0), T = qkv.size(1);
  Tensor out = empty_like_dev({B, T, H * hd}, qkv), lse = empty_like_dev({B, H, T}, qkv);
  K(qkv).attention.causal_forward(out.f32(), lse.f32(), qkv.f32(), B, T, H, KV, hd);
  if (should_record({&qkv})) {
    record("attention", out, {qkv}, [B, T, H, KV, hd, out, lse](Node& n) {
      const Tensor& q = n.inputs[0];
      K(q).attention.causal_backward(grad_ptr(q), grad_of(n.output).f32(), q.f32(), out.f32(), lse.f32(), B, T, H, KV, hd);
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
  Tensor losses = empty_like_dev({N}, logits), lse = empty_like_dev({N}, logits);
  K(logits).softmax.crossentropy_forward(losses.f32(), lse.f32(), logits.f32(), tg, N, V);
  const double total = K(logits).reduce.sum(losses.f32(), N);
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
        m.grad = reuse_logits ? lg : empty_like_dev(lg.shape(), lg);
        K(lg).softmax.crossentropy_backward(m.grad.f32(), dl.f32(), lg.f32(), lse.f32(), n.inputs[1].i32(), N, V);
      } else {
        Tensor tmp = empty_like_dev(lg.shape(), lg);
        K(lg).softmax.crossentropy_backward(tmp.f32(), dl.f32(), lg.f32(), lse.f32(), n.inputs[1].i32(), N, V);
        K(lg).elem.add_inplace(m.grad.f32(), tmp.f32(), tmp.numel());
      }
    });
  }
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& weights, const Tensor& mask) {
  check_f32(logits, "cross_entropy", "logits");
  check_i32(targets, "cross_entropy", "targets");
  const int64_t V = logits.size(-1), N = rows(logits);
  ATOLL_CHECK(targets.numel() == N, "cross_entropy: {} targets for {} rows", targets.numel(), N);
  if (weights.defined()) {
    check_f32(weights, "cross_entropy", "weights");
    ATOLL_CHECK(weights.numel() == N, "cross_entropy: {} weights for {} rows", weights.numel(), N);
  }
  if (mask.defined()) {
    check_i32(mask, "cross_entropy", "mask");
    ATOLL_CHECK(mask.numel() == N, "cross_entropy: {} mask entries for {} rows", mask.numel(), N);
  }
  // The effective per-row weight w_i·m_i (0 for negative targets); the loss is their weighted mean.
  const int32_t* tg = targets.i32();
  Tensor w = Tensor::empty({N});
  float* wp = w.f32();
  double W = 0;
  for (int64_t i = 0; i < N; ++i) {
    ATOLL_CHECK(tg[i] < V, "cross_entropy: target id {} at row {} is outside the vocabulary [0, {})", tg[i], i, V);
    const bool keep = tg[i] >= 0 && (!mask.defined() || mask.i32()[i] != 0);
    wp[i] = keep ? (weights.defined() ? weights.f32()[i] : 1.0f) : 0.0f;
    W += wp[i];
  }
  Tensor losses = empty_like_dev({N}, logits), lse = empty_like_dev({N}, logits);
  K(logits).softmax.crossentropy_forward(losses.f32(), lse.f32(), logits.f32(), tg, N, V);
  const double total = K(logits).reduce.dot(losses.f32(), wp, N);
  Tensor out = Tensor::full({1}, W != 0 ? float(total / W) : 0.f);
  if (should_record({&logits})) {
    record("cross_entropy_weighted", out, {logits, targets}, [N, V, W, w, lse](Node& n) {
      const Tensor& lg = n.inputs[0];
      if (!requires_grad(lg)) return;
      const float g = W != 0 ? float(grad_of(n.output).item() / W) : 0.0f;
      Tensor dl = Tensor::zeros({N});
      K(lg).elem.axpy(dl.f32(), g, w.f32(), N);
      Tensor tmp = empty_like_dev(lg.shape(), lg);
      K(lg).softmax.crossentropy_backward(tmp.f32(), dl.f32(), lg.f32(), lse.f32(), n.inputs[1].i32(), N, V);
      K(lg).elem.add_inplace(grad_buffer(lg).f32(), tmp.f32(), tmp.numel());
    });
  }
  return out;
}

Tensor attention(const Tensor& qkv, int64_t H, int64_t KV, int64_t hd, bool causal, const Tensor& doc_ids) {
  if (causal && !doc_ids.defined()) return attention(qkv, H, KV, hd);
  check_f32(qkv, "attention", "qkv");
  ATOLL_CHECK(qkv.dim() == 3 && qkv.size(2) == (H + 2 * KV) * hd, "attention: qkv {} is not [B,T,(H+2KV)*hd]",
              shape_str(qkv.shape()));
  ATOLL_CHECK(KV > 0 && H % KV == 0, "attention: {} query heads not divisible by {} kv heads", H, KV);
  const int64_t B = qkv.size(0), T = qkv.size(1);
  if (doc_ids.defined()) {
    check_i32(doc_ids, "attention", "doc_ids");
    ATOLL_CHECK(doc_ids.numel() == B * T, "attention: doc_ids {} for qkv {} (want [B,T])", shape_str(doc_ids.shape()),
                shape_str(qkv.shape()));
  }
  // Visible ranges per position: a document is a maximal run of equal ids (the whole row without ids).
  Tensor ranges = Tensor::empty({4, B * T}, DType::i32);
  int32_t *klo = ranges.i32(), *khi = klo + B * T, *qlo = khi + B * T, *qhi = qlo + B * T;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* id = doc_ids.defined() ? doc_ids.i32() + b * T : nullptr;
    for (int64_t s = 0; s < T;) {
      int64_t e = s + 1;
      while (id && e < T && id[e] == id[s]) ++e;
      if (!id) e = T;
      for (int64_t t = s; t < e; ++t) {
        const int64_t i = b * T + t;
        klo[i] = int32_t(s);
        khi[i] = int32_t(causal ? t + 1 : e);
        qlo[i] = int32_t(causal ? t : s);
        qhi[i] = int32_t(e);
      }
      s = e;
    }
  }
  const kernels::AttentionRanges rg{klo, khi, qlo, qhi};
  Tensor out = empty_like_dev({B, T, H * hd}, qkv), lse = empty_like_dev({B, H, T}, qkv);
  K(qkv).attention.ranged_forward(out.f32(), lse.f32(), qkv.f32(), rg, B, T, H, KV, hd);
  if (should_record({&qkv})) {
    record("attention_masked", out, {qkv}, [B, T, H, KV, hd, out, lse, ranges](Node& n) {
      const Tensor& q = n.inputs[0];
      const int32_t* r = ranges.i32();
      const kernels::AttentionRanges rg{r, r + B * T, r + 2 * B * T, r + 3 * B * T};
      K(q).attention.ranged_backward(grad_ptr(q), grad_of(n.output).f32(), q.f32(), out.f32(), lse.f32(), rg, B, T, H,
                                     KV, hd);
    });
  }
  return out;
}

Tensor doc_ids_from_cu_seqlens(const std::vector<int64_t>& cu) {
  ATOLL_CHECK(cu.size() >= 2 && cu.front() == 0, "cu_seqlens must start at 0 and hold at least one document");
  std::vector<int32_t> ids;
  for (size_t d = 1; d < cu.size(); ++d) {
    ATOLL_CHECK(cu[d] > cu[d - 1], "cu_seqlens must increase: entry {} is {} after {}", d, cu[d], cu[d - 1]);
    ids.insert(ids.end(), size_t(cu[d] - cu[d - 1]), int32_t(d - 1));
  }
  return Tensor::from_vector_i32(ids, {1, int64_t(ids.size())});
}

Tensor silu(const Tensor& x) {
  check_f32(x, "silu", "input");
  Tensor out = empty_like_dev(x.shape(), x);
  K(x).act.silu_forward(out.f32(), x.f32(), x.numel());
  if (should_record({&x})) {
    record("silu", out, {x}, [](Node& n) {
      const Tensor& xi = n.inputs[0];
      K(xi).act.silu_backward(grad_ptr(xi), grad_of(n.output).f32(), xi.f32(), xi.numel());
    });
  }
  return out;
}

Tensor sum(const Tensor& x) {
  check_f32(x, "sum", "input");
  Tensor out = Tensor::full({1}, float(K(x).reduce.sum(x.f32(), x.numel())));
  if (should_record({&x})) {
    record("sum", out, {x}, [](Node& n) {
      const Tensor& xi = n.inputs[0];
      float g = grad_of(n.output).item();
      K(xi).elem.add_scalar(grad_buffer(xi).f32(), g, xi.numel());
    });
  }
  return out;
}

Tensor dot_const(const Tensor& x, const Tensor& c) {
  check_f32(x, "dot_const", "input");
  check_f32(c, "dot_const", "constant");
  ATOLL_CHECK(x.numel() == c.numel(), "dot_const: sizes {} and {}", x.numel(), c.numel());
  check_same_device(x, c, "dot_const");
  Tensor out = Tensor::full({1}, float(K(x).reduce.dot(x.f32(), c.f32(), x.numel())));
  if (should_record({&x})) {
    record("dot_const", out, {x}, [c](Node& n) {
      const Tensor& xi = n.inputs[0];
      float g = grad_of(n.output).item();
      K(xi).elem.axpy(grad_buffer(xi).f32(), g, c.f32(), xi.numel());
    });
  }
  return out;
}

}  // namespace atl::ops


namespace atl::ops {

Tensor linear_t(const Tensor& x, const Tensor& w) {
  check_f32(x, "linear_t", "input");
  check_f32(w, "linear_t", "weight");
  int64_t OC = w.size(0), C = w.size(1), N = rows(x);
  ATOLL_CHECK(x.size(-1) == C, "linear_t: input {} does not match weight {}", shape_str(x.shape()), shape_str(w.shape()));
  if (matmul_dtype() == DType::bf16) return ops_bf16::linear_t(x, w, N, C, OC, with_last(x.shape(), OC));
  Tensor out = empty_like_dev(with_last(x.shape(), OC), x);
  K(x).gemm.gemm(false, true, N, OC, C, 1.f, x.f32(), C, w.f32(), C, 0.f, out.f32(), OC);
  if (should_record({&x, &w})) {
    record("linear_t", out, {x, w}, [N, C, OC](Node& n) {
      const Tensor &xi = n.inputs[0], &wi = n.inputs[1];
      Tensor gt = grad_of(n.output);
      const float* g = gt.f32();
      if (requires_grad(xi)) K(xi).gemm.gemm(false, false, N, C, OC, 1.f, g, OC, wi.f32(), C, 1.f, grad_ptr(xi), C);
      if (!requires_grad(wi)) return;
      std::function<void()> dw = [xi, wi, gt, N, C, OC] {  // deferrable (graph.h)
        K(xi).gemm.gemm(true, false, OC, C, N, 1.f, gt.f32(), OC, xi.f32(), C, 1.f, grad_ptr(wi), C);
      };
      if (!defer_weight_grad(dw)) dw();
    });
  }
  return out;
}

}  // namespace atl::ops
