// Numeric gradient check: compares the gradients backward() computes with central finite
// differences of a random projection of the op's output. Every differentiable op is tested with it.
#pragma once
#include <functional>
#include <vector>

#include "autograd/graph.h"

namespace atl {

struct GradCheckResult {
  double max_rel_error = 0;  // over all checked inputs, relative L2 per input
  size_t worst_input = 0;
};

// f maps the inputs to one output tensor. Inputs that require grad are checked (all their
// elements when small, a seeded sample of `max_elems` otherwise). Inputs are f32 leaves.
GradCheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs,
                          float eps = 1e-2f, int max_elems = 64, uint64_t seed = 1);

}  // namespace atl
