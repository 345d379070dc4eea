#include "optim/clip.h"

#include <cmath>

#include "kernels/cpu/kernels.h"

namespace atl {

double grad_norm(const Tensor& g) { return std::sqrt(cpu::sum_squares(g.f32(), g.numel())); }

float clip_coefficient(double norm, float max_norm) {
  if (max_norm <= 0) return 1.f;
  double c = double(max_norm) / (norm + 1e-6);
  return c < 1.0 ? float(c) : 1.f;
}

}  // namespace atl
