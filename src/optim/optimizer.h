// The optimizer interface. An optimizer owns its state and updates the parameters it was given;
// the trainer owns the learning-rate schedule and gradient clipping, and passes both in per step.
// A new optimizer is one file that implements this and registers a name with the factory.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"  // ParamRef, ParamRole
#include "tensor/safetensors.h"
#include "tensor/tensor.h"

namespace atl {

struct StepContext {
  float lr_scale = 1.f;    // schedule multiplier applied to every group's base learning rate
  float grad_scale = 1.f;  // multiplies gradients before use (clipping, loss scaling)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  virtual void step(const StepContext& ctx) = 0;
  // State as named tensors (prefix + "param_name.m", ...), for checkpoints; a step counter is
  // stored as a one-element i64 tensor.
  virtual void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const = 0;
  virtual void load_state(const TensorFile& f, const std::string& prefix) = 0;
  int64_t steps() const { return steps_; }

 protected:
  int64_t steps_ = 0;
};

}  // namespace atl
