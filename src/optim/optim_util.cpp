// Shared helpers for the optimizers; see optim_util.h.
#include "optim/optim_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace atl::optim {

Layout parse_layout(const std::string& s) {
  if (s == "in_out") return Layout::in_out;
  if (s == "out_in") return Layout::out_in;
  fail("unknown weight layout '{}': use \"in_out\" (atoll, HF Conv1D) or \"out_in\" (torch nn.Linear)", s);
}

UpdateScale parse_update_scale(const std::string& s) {
  if (s == "none") return UpdateScale::none;
  if (s == "keller") return UpdateScale::keller;
  if (s == "spectral") return UpdateScale::spectral;
  if (s == "rms") return UpdateScale::rms;
  fail("unknown update scale '{}': use keller, spectral, rms or none", s);
}

float update_scale(UpdateScale s, int64_t rows, int64_t cols, Layout layout) {
  double fan_in = layout == Layout::in_out ? double(rows) : double(cols);
  double fan_out = layout == Layout::in_out ? double(cols) : double(rows);
  switch (s) {
    case UpdateScale::none: return 1.f;
    case UpdateScale::keller: return float(std::sqrt(std::max(1.0, fan_out / fan_in)));
    case UpdateScale::spectral: return float(std::sqrt(fan_out / fan_in));
    case UpdateScale::rms: return float(0.2 * std::sqrt(double(std::max(rows, cols))));
  }
  return 1.f;
}

MatDims mat_dims(const Tensor& t) {
  ATOLL_CHECK(t.dim() >= 2, "expected a matrix, got shape {}", shape_str(t.shape()));
  return {t.size(0), t.numel() / t.size(0)};
}

Tensor step_tensor(int64_t step) {
  Tensor t = Tensor::empty({1}, DType::i64);
  *t.data<int64_t>() = step;
  return t;
}

int64_t read_step(const TensorFile& f, const std::string& key) {
  const Tensor& t = f.get(key);
  ATOLL_CHECK(t.dtype() == DType::i64 && t.numel() == 1, "optimizer state {} must be a one-element i64 tensor", key);
  return *t.data<int64_t>();
}

void load_checked(Tensor& dst, const TensorFile& f, const std::string& key) {
  const Tensor& src = f.get(key);
  ATOLL_CHECK(src.shape() == dst.shape(), "optimizer state {} has shape {}, expected {} (was the model changed?)",
              key, shape_str(src.shape()), shape_str(dst.shape()));
  dst.copy_from(src);
}

void scale_into(float* dst, const float* src, float s, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) dst[i] = s * src[i];
}

double sum_sq(const float* x, int64_t n) {
  double acc = 0;
#pragma omp parallel for reduction(+ : acc) schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) acc += double(x[i]) * double(x[i]);
  return acc;
}

void check_param(const ParamRef& p, const char* optimizer) {
  ATOLL_CHECK(p.value.is_contiguous() && p.grad.is_contiguous() && p.value.dtype() == DType::f32 &&
                  p.grad.shape() == p.value.shape(),
              "{}: parameter {} must be contiguous f32 with a gradient of its shape", optimizer, p.name);
}

}  // namespace atl::optim
