#include "nn/module.h"

namespace atl {

const char* param_role_name(ParamRole r) {
  switch (r) {
    case ParamRole::automatic: return "automatic";
    case ParamRole::matrix: return "matrix";
    case ParamRole::embedding: return "embedding";
    case ParamRole::head: return "head";
    case ParamRole::vector: return "vector";
    case ParamRole::expert: return "expert";
  }
  return "?";
}

ParamRole resolve_role(ParamRole r, const Shape& shape) {
  if (r != ParamRole::automatic) return r;
  return shape.size() < 2 ? ParamRole::vector : ParamRole::matrix;
}

}  // namespace atl

namespace atl::nn {

Parameter* Module::declare(const std::string& local_name, const Shape& shape, ParamRole role) {
  auto p = std::make_unique<Parameter>();
  p->name = child_prefix(local_name);
  p->shape = shape;
  p->role = resolve_role(role, shape);
  params_.push_back(std::move(p));
  return params_.back().get();
}

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> out;
  for (auto& p : params_) out.push_back(p.get());
  for (auto& c : children_)
    for (Parameter* p : c->parameters()) out.push_back(p);
  return out;
}

Parameter* Module::find(const std::string& full_name) {
  for (Parameter* p : parameters())
    if (p->name == full_name) return p;
  return nullptr;
}

int64_t Module::num_params() {
  int64_t n = 0;
  for (Parameter* p : parameters()) n += shape_numel(p->shape);
  return n;
}

std::vector<ParamRef> Module::param_refs() {
  std::vector<ParamRef> out;
  for (Parameter* p : parameters()) out.push_back({p->name, p->value, p->grad, p->role});
  return out;
}

void Module::materialize() {
  auto ps = parameters();
  // Each parameter starts on a 64-byte boundary so kernels see aligned rows.
  auto align = [](int64_t n) { return (n + 15) / 16 * 16; };
  int64_t total = 0;
  for (Parameter* p : ps) total += align(shape_numel(p->shape));
  flat_values_ = Tensor::zeros({total});
  flat_grads_ = Tensor::zeros({total});
  int64_t off = 0;
  for (Parameter* p : ps) {
    int64_t n = shape_numel(p->shape);
    p->value = flat_values_.slice(0, off, off + n).view(p->shape);
    p->grad = flat_grads_.slice(0, off, off + n).view(p->shape);
    set_requires_grad(p->value, true, p->name, p->grad);
    off += align(n);
  }
}

}  // namespace atl::nn
