// Helpers shared by the files that define autograd ops (ops.cpp, ops_math.cpp, ops_index.cpp);
// private to the autograd layer.
#pragma once
#include "autograd/graph.h"
#include "kernels/dispatch.h"

namespace atl::ops::detail {

inline void check_f32(const Tensor& t, const char* op, const char* what) {
  ATOLL_CHECK(t.defined(), "{}: {} is undefined", op, what);
  ATOLL_CHECK(t.dtype() == DType::f32, "{}: {} must be f32, got {}", op, what, dtype_name(t.dtype()));
  ATOLL_CHECK(t.is_contiguous(), "{}: {} must be contiguous", op, what);
}

inline void check_i32(const Tensor& t, const char* op, const char* what) {
  ATOLL_CHECK(t.defined(), "{}: {} is undefined", op, what);
  ATOLL_CHECK(t.dtype() == DType::i32, "{}: {} must be i32, got {}", op, what, dtype_name(t.dtype()));
  ATOLL_CHECK(t.is_contiguous(), "{}: {} must be contiguous", op, what);
}

inline void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  if (a.defined() && b.defined())
    ATOLL_CHECK(a.device() == b.device(), "{}: inputs on {} and {}", op, a.device().str(), b.device().str());
}

// The kernel table for the tensor's device and dtype (kernels/dispatch.h).
inline const kernels::KernelTable& K(const Tensor& t) { return kernels::table(t.device(), t.dtype()); }

// A new tensor of `shape` on like's device.
inline Tensor empty_like_dev(const Shape& shape, const Tensor& like) {
  return Tensor::empty(shape, DType::f32, like.device());
}
inline Tensor zeros_like_dev(const Shape& shape, const Tensor& like) {
  return Tensor::zeros(shape, DType::f32, like.device());
}

inline int64_t rows(const Tensor& x) { return x.numel() / x.size(-1); }

inline Shape with_last(const Shape& s, int64_t last) {
  Shape r = s;
  r.back() = last;
  return r;
}

inline float* grad_ptr(const Tensor& t) { return requires_grad(t) ? grad_buffer(t).f32() : nullptr; }

inline int64_t norm_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t d = dim < 0 ? dim + ndim : dim;
  ATOLL_CHECK(d >= 0 && d < ndim, "{}: dim {} is out of range for a {}-d tensor", op, dim, ndim);
  return d;
}

// [O, N, I] around dim d of shape s.
struct Around {
  int64_t O = 1, N = 1, I = 1;
};
inline Around around(const Shape& s, int64_t d) {
  Around a;
  for (int64_t i = 0; i < int64_t(s.size()); ++i) (i < d ? a.O : i == d ? a.N : a.I) *= s[size_t(i)];
  return a;
}

}  // namespace atl::ops::detail
