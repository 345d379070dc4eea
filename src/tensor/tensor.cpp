#include "tensor/tensor.h"

#include <cmath>
#include <cstring>

namespace atl {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

Storage::Storage(size_t n, Device d) : nbytes(n), device(d) {
  data = allocator_for(d).allocate(n);
}
Storage::Storage(void* external, size_t n, Device d) : data(external), nbytes(n), device(d), owned(false) {}
Storage::~Storage() {
  if (owned && data) allocator_for(device).deallocate(data, nbytes);
}

Shape Tensor::contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t i = int64_t(s.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

Tensor Tensor::empty(const Shape& shape, DType dt, Device dev) {
  for (auto d : shape) ATOLL_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.storage_ = std::make_shared<Storage>(size_t(shape_numel(shape)) * dtype_size(dt), dev);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dt;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dt, Device dev) {
  Tensor t = empty(shape, dt, dev);
  t.zero();
  return t;
}

Tensor Tensor::full(const Shape& shape, float value, DType dt) {
  Tensor t = empty(shape, dt);
  t.fill(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape) {
  ATOLL_CHECK(int64_t(v.size()) == shape_numel(shape), "from_vector: {} values for shape {}", v.size(),
              shape_str(shape));
  Tensor t = empty(shape, DType::f32);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

Tensor Tensor::from_vector_i32(const std::vector<int32_t>& v, const Shape& shape) {
  ATOLL_CHECK(int64_t(v.size()) == shape_numel(shape), "from_vector_i32: {} values for shape {}",
              v.size(), shape_str(shape));
  Tensor t = empty(shape, DType::i32);
  std::memcpy(t.raw(), v.data(), v.size() * 4);
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dt, Device dev) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(data, size_t(shape_numel(shape)) * dtype_size(dt), dev);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dt;
  return t;
}

int64_t Tensor::size(int64_t d) const {
  if (d < 0) d += dim();
  ATOLL_CHECK(d >= 0 && d < dim(), "dimension {} out of range for shape {}", d, shape_str(shape_));
  return shape_[d];
}

bool Tensor::is_contiguous() const {
  int64_t acc = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

float* Tensor::f32() const {
  ATOLL_CHECK(dtype_ == DType::f32, "expected an f32 tensor, got {}", dtype_name(dtype_));
  return data<float>();
}
int32_t* Tensor::i32() const {
  ATOLL_CHECK(dtype_ == DType::i32, "expected an i32 tensor, got {}", dtype_name(dtype_));
  return data<int32_t>();
}

Tensor Tensor::view(const Shape& shape) const {
  ATOLL_CHECK(is_contiguous(), "view() of a non-contiguous tensor {}; use reshape()", shape_str(shape_));
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      ATOLL_CHECK(infer < 0, "view(): more than one -1 in {}", shape_str(shape));
      infer = int64_t(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    ATOLL_CHECK(known > 0 && numel() % known == 0, "view(): cannot infer {} from {}", shape_str(shape),
                shape_str(shape_));
    s[infer] = numel() / known;
  }
  ATOLL_CHECK(shape_numel(s) == numel(), "view(): shape {} does not match {} elements of {}",
              shape_str(s), numel(), shape_str(shape_));
  Tensor t = *this;
  t.autograd_.reset();
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  return is_contiguous() ? view(shape) : contiguous().view(shape);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  if (d0 < 0) d0 += dim();
  if (d1 < 0) d1 += dim();
  ATOLL_CHECK(d0 >= 0 && d0 < dim() && d1 >= 0 && d1 < dim(), "transpose({}, {}) of shape {}", d0, d1,
              shape_str(shape_));
  Tensor t = *this;
  t.autograd_.reset();
  std::swap(t.shape_[d0], t.shape_[d1]);
  std::swap(t.strides_[d0], t.strides_[d1]);
  return t;
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end) const {
  if (d < 0) d += dim();
  ATOLL_CHECK(d >= 0 && d < dim(), "slice: dim {} of shape {}", d, shape_str(shape_));
  ATOLL_CHECK(0 <= start && start <= end && end <= shape_[d], "slice [{}, {}) out of range for dim {} of {}",
              start, end, d, shape_str(shape_));
  Tensor t = *this;
  t.autograd_.reset();
  t.offset_ += start * strides_[d];
  t.shape_[d] = end - start;
  return t;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  Tensor t = slice(d, index, index + 1);
  if (d < 0) d += dim();
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

namespace {
// Visits every element of a strided tensor in row-major order.
template <typename F>
void for_each_offset(const Shape& shape, const Shape& strides, F&& f) {
  int64_t n = shape_numel(shape);
  if (n == 0) return;
  int64_t nd = int64_t(shape.size());
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    f(i, off);
    for (int64_t d = nd - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= (shape[d] - 1) * strides[d];
      idx[d] = 0;
    }
  }
}

float load_as_float(const void* base, DType dt, int64_t off) {
  switch (dt) {
    case DType::f32: return static_cast<const float*>(base)[off];
    case DType::bf16: return bf16_to_float(static_cast<const bf16*>(base)[off]);
    case DType::i32: return float(static_cast<const int32_t*>(base)[off]);
    case DType::i64: return float(static_cast<const int64_t*>(base)[off]);
  }
  return 0;
}
}  // namespace

void Tensor::copy_from(const Tensor& src) {
  ATOLL_CHECK(src.shape_ == shape_, "copy_from: shape {} into {}", shape_str(src.shape_), shape_str(shape_));
  ATOLL_CHECK(device().is_cpu() && src.device().is_cpu(), "copy_from on non-CPU tensors needs a device backend");
  if (src.dtype_ == dtype_ && is_contiguous() && src.is_contiguous()) {
    std::memmove(raw(), src.raw(), nbytes());
    return;
  }
  const char* sbase = static_cast<const char*>(src.raw());
  char* dbase = static_cast<char*>(raw());
  size_t ses = dtype_size(src.dtype_), des = dtype_size(dtype_);
  std::vector<int64_t> soffs;
  soffs.reserve(size_t(numel()));
  for_each_offset(src.shape_, src.strides_, [&](int64_t, int64_t o) { soffs.push_back(o); });
  int64_t k = 0;
  for_each_offset(shape_, strides_, [&](int64_t, int64_t o) {
    int64_t so = soffs[size_t(k++)];
    if (src.dtype_ == dtype_) {
      std::memcpy(dbase + o * des, sbase + so * ses, des);
      return;
    }
    float v = load_as_float(sbase, src.dtype_, so);
    switch (dtype_) {
      case DType::f32: reinterpret_cast<float*>(dbase)[o] = v; break;
      case DType::bf16: reinterpret_cast<bf16*>(dbase)[o] = float_to_bf16(v); break;
      case DType::i32: reinterpret_cast<int32_t*>(dbase)[o] = int32_t(v); break;
      case DType::i64: reinterpret_cast<int64_t*>(dbase)[o] = int64_t(v); break;
    }
  });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype_) return *this;
  Tensor t = empty(shape_, dt, device());
  t.copy_from(*this);
  return t;
}

void Tensor::fill(float v) {
  char* base = static_cast<char*>(raw());
  for_each_offset(shape_, strides_, [&](int64_t, int64_t o) {
    switch (dtype_) {
      case DType::f32: reinterpret_cast<float*>(base)[o] = v; break;
      case DType::bf16: reinterpret_cast<bf16*>(base)[o] = float_to_bf16(v); break;
      case DType::i32: reinterpret_cast<int32_t*>(base)[o] = int32_t(v); break;
      case DType::i64: reinterpret_cast<int64_t*>(base)[o] = int64_t(v); break;
    }
  });
}

void Tensor::zero() {
  if (is_contiguous()) std::memset(raw(), 0, nbytes());
  else fill(0.f);
}

float Tensor::item() const {
  ATOLL_CHECK(numel() == 1, "item() of a tensor with {} elements", numel());
  return load_as_float(raw(), dtype_, 0);
}

float Tensor::at(std::initializer_list<int64_t> idx) const {
  ATOLL_CHECK(int64_t(idx.size()) == dim(), "at(): {} indices for shape {}", idx.size(), shape_str(shape_));
  int64_t off = 0, d = 0;
  for (auto i : idx) {
    ATOLL_CHECK(i >= 0 && i < shape_[d], "at(): index {} out of range in dim {} of {}", i, d, shape_str(shape_));
    off += i * strides_[d++];
  }
  return load_as_float(raw(), dtype_, off);
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  const void* base = raw();
  for_each_offset(shape_, strides_, [&](int64_t i, int64_t o) { out[size_t(i)] = load_as_float(base, dtype_, o); });
  return out;
}

std::string Tensor::str(int64_t max_elems) const {
  std::string s = fmt::format("Tensor({}, {}", shape_str(shape_), dtype_name(dtype_));
  if (defined()) {
    auto v = to_vector();
    s += ", [";
    for (int64_t i = 0; i < std::min<int64_t>(max_elems, int64_t(v.size())); ++i) s += (i ? ", " : "") + fmt::format("{:.6g}", v[size_t(i)]);
    if (int64_t(v.size()) > max_elems) s += ", ...";
    s += "]";
  }
  return s + ")";
}

double rel_error(const Tensor& a, const Tensor& b) {
  ATOLL_CHECK(a.shape() == b.shape(), "rel_error: shapes {} and {}", shape_str(a.shape()), shape_str(b.shape()));
  auto va = a.to_vector(), vb = b.to_vector();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    double d = double(va[i]) - double(vb[i]);
    num += d * d;
    den += double(vb[i]) * double(vb[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  ATOLL_CHECK(a.shape() == b.shape(), "max_abs_diff: shapes {} and {}", shape_str(a.shape()), shape_str(b.shape()));
  auto va = a.to_vector(), vb = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::fabs(double(va[i]) - double(vb[i])));
  return m;
}

}  // namespace atl
