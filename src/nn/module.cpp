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
  retain_parameters([](const Parameter&) { return true; });
}

void Module::retain_parameters(const std::function<bool(const Parameter&)>& keep) {
  auto ps = parameters();
  // Each parameter starts on a 64-byte boundary so kernels see aligned rows.
  auto align = [](int64_t n) { return (n + 15) / 16 * 16; };
  int64_t total = 0;
  for (Parameter* p : ps)
    if (keep(*p)) total += align(shape_numel(p->shape));
  Tensor values = Tensor::zeros({total}), grads = Tensor::zeros({total});
  int64_t off = 0;
  for (Parameter* p : ps) {
    if (!keep(*p)) {
      p->value = Tensor();
      p->grad = Tensor();
      continue;
    }
    int64_t n = shape_numel(p->shape);
    Tensor v = values.slice(0, off, off + n).view(p->shape), g = grads.slice(0, off, off + n).view(p->shape);
    if (p->value.defined()) v.copy_from(p->value);
    if (p->grad.defined()) g.copy_from(p->grad);
    p->value = v;
    p->grad = g;
    set_requires_grad(p->value, true, p->name, p->grad);
    off += align(n);
  }
  flat_values_ = values;
  flat_grads_ = grads;
}

}  // namespace atl::nn
