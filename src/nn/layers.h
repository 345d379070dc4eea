// The basic layers. Linear stores its weight [in, out] (Hugging Face GPT-2's Conv1D layout).
#pragma once
#include "autograd/ops.h"
#include "nn/module.h"

namespace atl::nn {

class Linear : public Module {
 public:
  // weight_role: matrix for hidden layers; a model's output layer declares head.
  Linear(std::string prefix, int64_t in, int64_t out, bool bias, ParamRole weight_role = ParamRole::matrix);
  Tensor operator()(const Tensor& x) const { return ops::linear(x, weight->value, bias ? bias->value : Tensor()); }
  Parameter* weight;
  Parameter* bias = nullptr;
};

class Embedding : public Module {
 public:
  Embedding(std::string prefix, int64_t num, int64_t dim);
  Parameter* weight;
};

// LayerNorm (with or without bias) or RMSNorm, chosen by the model config.
class Norm : public Module {
 public:
  Norm(std::string prefix, int64_t dim, bool rms, bool bias, float eps);
  Tensor operator()(const Tensor& x) const {
    return rms_ ? ops::rmsnorm(x, weight->value, eps_)
                : ops::layernorm(x, weight->value, bias ? bias->value : Tensor(), eps_);
  }
  Parameter* weight;
  Parameter* bias = nullptr;

 private:
  bool rms_;
  float eps_;
};

}  // namespace atl::nn
