#include "nn/layers.h"

namespace atl::nn {

Linear::Linear(std::string prefix, int64_t in, int64_t out, bool has_bias, ParamRole weight_role)
    : Module(std::move(prefix)) {
  weight = declare("weight", {in, out}, weight_role);
  if (has_bias) bias = declare("bias", {out}, ParamRole::vector);
}

Embedding::Embedding(std::string prefix, int64_t num, int64_t dim) : Module(std::move(prefix)) {
  weight = declare("weight", {num, dim}, ParamRole::embedding);
}

Norm::Norm(std::string prefix, int64_t dim, bool rms, bool has_bias, float eps)
    : Module(std::move(prefix)), rms_(rms), eps_(eps) {
  weight = declare("weight", {dim}, ParamRole::vector);
  if (has_bias && !rms) bias = declare("bias", {dim}, ParamRole::vector);
}

}  // namespace atl::nn
