// Tensor: a typed, strided view of reference-counted storage on a device.
//
// Views (reshape of contiguous data, transpose, slice) share storage; contiguous() and clone()
// copy. A tensor also carries an optional autograd record, defined by the autograd layer and
// only forward-declared here so that this layer knows nothing about graphs.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "tensor/allocator.h"
#include "tensor/dtype.h"

namespace atl {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

struct Storage {
  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  bool owned = true;  // false: wraps memory someone else frees (mmap'd files, user buffers)
  Storage(size_t n, Device d);
  Storage(void* external, size_t n, Device d);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

struct AutogradMeta;  // autograd/graph.h

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, DType dt = DType::f32, Device dev = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dt = DType::f32, Device dev = Device::cpu());
  static Tensor full(const Shape& shape, float value, DType dt = DType::f32);
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape);
  static Tensor from_vector_i32(const std::vector<int32_t>& v, const Shape& shape);
  // Wraps memory the caller keeps alive (no copy).
  static Tensor wrap(void* data, const Shape& shape, DType dt, Device dev = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return int64_t(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::cpu(); }
  int64_t offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool is_contiguous() const;
  bool same_storage(const Tensor& o) const { return storage_ == o.storage_; }

  void* raw() const { return static_cast<char*>(storage_->data) + offset_ * dtype_size(dtype_); }
  template <typename T> T* data() const { return static_cast<T*>(raw()); }
  float* f32() const;    // checked: dtype f32
  int32_t* i32() const;  // checked: dtype i32

  // Views.
  Tensor view(const Shape& shape) const;  // contiguous only; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // view if possible, else a contiguous copy
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end) const;
  Tensor select(int64_t dim, int64_t index) const;  // drops the dim
  Tensor flatten() const { return reshape({numel()}); }

  // Copies.
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(DType dt) const;
  void copy_from(const Tensor& src);  // same shape; any dtype pair among f32/bf16, or equal dtypes
  void fill(float v);
  void zero();

  // Element access for tests and small tools (slow).
  float item() const;
  float at(std::initializer_list<int64_t> idx) const;
  std::vector<float> to_vector() const;

  std::string str(int64_t max_elems = 8) const;

  // Autograd record (null for plain tensors).
  const std::shared_ptr<AutogradMeta>& autograd() const { return autograd_; }
  void set_autograd(std::shared_ptr<AutogradMeta> m) { autograd_ = std::move(m); }

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_, strides_;
  DType dtype_ = DType::f32;
  std::shared_ptr<AutogradMeta> autograd_;

  static Shape contiguous_strides(const Shape& s);
};

// Relative L2 error ||a-b|| / max(||b||, tiny): how tests compare with references.
double rel_error(const Tensor& a, const Tensor& b);
double max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace atl
