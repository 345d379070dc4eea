// Autograd ops that index, aggregate and reshape: index_select, gather, scatter_add, segment_sum,
// top-k, concat and split. Index tensors are i32 and checked on the host before any kernel runs,
// so a bad index is an error naming the op and the position, never a stray write.
#include <algorithm>

#include "autograd/ops.h"
#include "autograd/ops_util.h"

namespace atl::ops {

using namespace detail;

namespace {

void check_indices(const Tensor& idx, int64_t n, const char* op, const char* what) {
  const int32_t* p = idx.i32();
  for (int64_t i = 0; i < idx.numel(); ++i)
    ATOLL_CHECK(p[i] >= 0 && p[i] < n, "{}: {} {} at position {} is outside [0, {})", op, what, p[i], i, n);
}

bool any_requires_grad(const std::vector<Tensor>& ts) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : ts)
    if (requires_grad(t)) return true;
  return false;
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  check_f32(x, "index_select", "input");
  check_i32(index, "index_select", "index");
  ATOLL_CHECK(index.dim() == 1, "index_select: index must be 1-d, got {}", shape_str(index.shape()));
  const int64_t d = norm_dim(dim, x.dim(), "index_select");
  const Around a = around(x.shape(), d);
  check_indices(index, a.N, "index_select", "index");
  const int64_t M = index.numel();
  Shape shape = x.shape();
  shape[size_t(d)] = M;
  Tensor out = zeros_like_dev(shape, x);
  K(x).index.gather_rows(out.f32(), x.f32(), index.i32(), a.O, a.N, M, a.I);
  if (should_record({&x})) {
    record("index_select", out, {x, index}, [a, M](Node& n) {
      const Tensor& xi = n.inputs[0];
      K(xi).index.scatter_rows(grad_ptr(xi), grad_of(n.output).f32(), n.inputs[1].i32(), a.O, a.N, M, a.I);
    });
  }
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  check_f32(x, "gather", "input");
  check_i32(index, "gather", "index");
  const int64_t d = norm_dim(dim, x.dim(), "gather");
  ATOLL_CHECK(index.dim() == x.dim(), "gather: index {} and input {} differ in rank", shape_str(index.shape()),
              shape_str(x.shape()));
  for (int64_t i = 0; i < x.dim(); ++i)
    ATOLL_CHECK(i == d || index.size(i) == x.size(i), "gather: index {} and input {} differ outside dim {}",
                shape_str(index.shape()), shape_str(x.shape()), d);
  const Around a = around(x.shape(), d);
  check_indices(index, a.N, "gather", "index");
  const int64_t Kd = index.size(d);
  Tensor out = zeros_like_dev(index.shape(), x);
  K(x).index.gather_elems(out.f32(), x.f32(), index.i32(), a.O, a.N, Kd, a.I);
  if (should_record({&x})) {
    record("gather", out, {x, index}, [a, Kd](Node& n) {
      const Tensor& xi = n.inputs[0];
      K(xi).index.scatter_elems(grad_ptr(xi), grad_of(n.output).f32(), n.inputs[1].i32(), a.O, a.N, Kd, a.I);
    });
  }
  return out;
}

Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src) {
  check_f32(base, "scatter_add", "base");
  check_f32(src, "scatter_add", "src");
  check_i32(index, "scatter_add", "index");
  check_same_device(base, src, "scatter_add");
  const int64_t d = norm_dim(dim, base.dim(), "scatter_add");
  ATOLL_CHECK(index.shape() == src.shape(), "scatter_add: index {} and src {} differ in shape",
              shape_str(index.shape()), shape_str(src.shape()));
  ATOLL_CHECK(src.dim() == base.dim(), "scatter_add: src {} and base {} differ in rank", shape_str(src.shape()),
              shape_str(base.shape()));
  for (int64_t i = 0; i < base.dim(); ++i)
    ATOLL_CHECK(i == d || src.size(i) == base.size(i), "scatter_add: src {} and base {} differ outside dim {}",
                shape_str(src.shape()), shape_str(base.shape()), d);
  const Around a = around(base.shape(), d);
  check_indices(index, a.N, "scatter_add", "index");
  const int64_t Kd = src.size(d);
  Tensor out = empty_like_dev(base.shape(), base);
  const auto& k = K(base);
  k.elem.copy_rows(out.f32(), 0, base.f32(), 0, 1, base.numel(), false);
  k.index.scatter_elems(out.f32(), src.f32(), index.i32(), a.O, a.N, Kd, a.I);
  if (should_record({&base, &src})) {
    record("scatter_add", out, {base, index, src}, [a, Kd](Node& n) {
      const Tensor &bi = n.inputs[0], &si = n.inputs[2];
      const Tensor& g = grad_of(n.output);
      if (requires_grad(bi)) K(g).elem.add_inplace(grad_buffer(bi).f32(), g.f32(), g.numel());
      if (requires_grad(si))
        K(g).index.gather_elems(grad_buffer(si).f32(), g.f32(), n.inputs[1].i32(), a.O, a.N, Kd, a.I);
    });
  }
  return out;
}

Tensor segment_sum(const Tensor& x, const Tensor& segment_ids, int64_t num_segments) {
  check_f32(x, "segment_sum", "input");
  check_i32(segment_ids, "segment_sum", "segment_ids");
  ATOLL_CHECK(x.dim() >= 1 && segment_ids.numel() == x.size(0), "segment_sum: {} segment ids for input {}",
              segment_ids.numel(), shape_str(x.shape()));
  ATOLL_CHECK(num_segments >= 0, "segment_sum: {} segments", num_segments);
  check_indices(segment_ids, num_segments, "segment_sum", "segment id");
  const int64_t N = x.size(0), I = N ? x.numel() / N : 0;
  Shape shape = x.shape();
  shape[0] = num_segments;
  Tensor out = zeros_like_dev(shape, x);
  K(x).index.scatter_rows(out.f32(), x.f32(), segment_ids.i32(), 1, num_segments, N, I);
  if (should_record({&x})) {
    record("segment_sum", out, {x, segment_ids}, [N, I, num_segments](Node& n) {
      const Tensor& xi = n.inputs[0];
      K(xi).index.gather_rows(grad_ptr(xi), grad_of(n.output).f32(), n.inputs[1].i32(), 1, num_segments, N, I);
    });
  }
  return out;
}

TopK topk(const Tensor& x, int64_t k) {
  check_f32(x, "topk", "input");
  const int64_t C = x.size(-1), N = rows(x);
  ATOLL_CHECK(k >= 1 && k <= C, "topk: k = {} for a last dim of {}", k, C);
  TopK r;
  r.values = empty_like_dev(with_last(x.shape(), k), x);
  r.indices = Tensor::empty(with_last(x.shape(), k), DType::i32, x.device());
  K(x).index.topk_forward(r.values.f32(), r.indices.i32(), x.f32(), N, C, k);
  if (should_record({&x})) {
    record("topk", r.values, {x, r.indices}, [N, C, k](Node& n) {
      const Tensor& xi = n.inputs[0];
      K(xi).index.topk_backward(grad_ptr(xi), grad_of(n.output).f32(), n.inputs[1].i32(), N, C, k);
    });
  }
  return r;
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  ATOLL_CHECK(!xs.empty(), "concat: no tensors");
  for (const Tensor& t : xs) {
    check_f32(t, "concat", "input");
    check_same_device(xs[0], t, "concat");
  }
  const int64_t d = norm_dim(dim, xs[0].dim(), "concat");
  Shape shape = xs[0].shape();
  shape[size_t(d)] = 0;
  for (const Tensor& t : xs) {
    ATOLL_CHECK(t.dim() == xs[0].dim(), "concat: inputs {} and {} differ in rank", shape_str(xs[0].shape()),
                shape_str(t.shape()));
    for (int64_t i = 0; i < t.dim(); ++i)
      ATOLL_CHECK(i == d || t.size(i) == xs[0].size(i), "concat: inputs {} and {} differ outside dim {}",
                  shape_str(xs[0].shape()), shape_str(t.shape()), d);
    shape[size_t(d)] += t.size(d);
  }
  const Around a = around(shape, d);  // rows O, row length N*I
  const int64_t ld = a.N * a.I;
  Tensor out = empty_like_dev(shape, xs[0]);
  const auto& kt = K(xs[0]);
  int64_t off = 0;
  for (const Tensor& t : xs) {
    const int64_t w = t.size(d) * a.I;
    kt.elem.copy_rows(out.f32() + off, ld, t.f32(), w, a.O, w, false);
    off += w;
  }
  if (any_requires_grad(xs)) {
    record("concat", out, xs, [a, ld, d](Node& n) {
      const Tensor& g = grad_of(n.output);
      int64_t off = 0;
      for (const Tensor& t : n.inputs) {
        const int64_t w = t.size(d) * a.I;
        if (requires_grad(t)) K(g).elem.copy_rows(grad_buffer(t).f32(), w, g.f32() + off, ld, a.O, w, true);
        off += w;
      }
    });
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_f32(x, "split", "input");
  const int64_t d = norm_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    ATOLL_CHECK(s >= 0, "split: negative size {}", s);
    total += s;
  }
  ATOLL_CHECK(total == x.size(d), "split: sizes sum to {} but dim {} has {}", total, d, x.size(d));
  const Around a = around(x.shape(), d);
  const int64_t ld = a.N * a.I;
  const bool rec = should_record({&x});
  std::vector<Tensor> out;
  int64_t off = 0;
  for (int64_t s : sizes) {
    Shape shape = x.shape();
    shape[size_t(d)] = s;
    const int64_t w = s * a.I;
    Tensor piece = empty_like_dev(shape, x);
    K(x).elem.copy_rows(piece.f32(), w, x.f32() + off, ld, a.O, w, false);
    if (rec) {
      record("split", piece, {x}, [a, ld, w, off](Node& n) {
        const Tensor& xi = n.inputs[0];
        K(xi).elem.copy_rows(grad_buffer(xi).f32() + off, ld, grad_of(n.output).f32(), w, a.O, w, true);
      });
    }
    out.push_back(piece);
    off += w;
  }
  return out;
}

}  // namespace atl::ops
