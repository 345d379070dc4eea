// Global gradient-norm clipping, folded into the optimizer's grad_scale rather than applied as a
// separate pass over the gradients. Same coefficient as torch.nn.utils.clip_grad_norm_.
#pragma once
#include "tensor/tensor.h"

namespace atl {

// L2 norm of a flat f32 gradient buffer (accumulated in double).
double grad_norm(const Tensor& flat_grads);
// min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (clipping off).
float clip_coefficient(double norm, float max_norm);

}  // namespace atl
