// Helpers shared by the matrix optimizers: the matrix view of a parameter, the update-scale rules
// of the Muon family, and checked state save/load. Kept apart so that each optimizer file holds
// only its own algorithm.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/safetensors.h"
#include "tensor/tensor.h"

namespace atl::optim {

// How a 2-D weight is laid out. atoll's Linear stores [in, out] (Hugging Face Conv1D), PyTorch's
// nn.Linear stores [out, in]; fan-in/fan-out based rules need to know which.
enum class Layout { in_out, out_in };
Layout parse_layout(const std::string& s);

// Update scale applied to an orthogonalized update of a rows x cols matrix:
//  keller:   max(1, fan_out/fan_in)^1/2       (Jordan et al., Muon)
//  spectral: (fan_out/fan_in)^1/2             (Bernstein et al., spectral-norm condition)
//  rms:      0.2 * max(rows, cols)^1/2        (Liu et al., "Muon is scalable": RMS-matched to AdamW)
//  none:     1
enum class UpdateScale { none, keller, spectral, rms };
UpdateScale parse_update_scale(const std::string& s);
float update_scale(UpdateScale s, int64_t rows, int64_t cols, Layout layout);

// rows x cols view of a parameter: dim 0 by the product of the rest.
struct MatDims {
  int64_t rows = 0, cols = 0;
};
MatDims mat_dims(const Tensor& t);

// A one-element i64 tensor holding a step counter, and back.
// Every optimizer here works on contiguous f32 values with a gradient of the same shape.
void check_param(const ParamRef& p, const char* optimizer);

Tensor step_tensor(int64_t step);
int64_t read_step(const TensorFile& f, const std::string& key);
// Copies a saved tensor into dst, failing with the names if the shapes differ.
void load_checked(Tensor& dst, const TensorFile& f, const std::string& key);

// Elementwise helpers over raw buffers (OpenMP-parallel for large n).
void scale_into(float* dst, const float* src, float s, int64_t n);  // dst = s * src
double sum_sq(const float* x, int64_t n);

}  // namespace atl::optim
