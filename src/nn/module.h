// Modules: a tree of named parts owning parameters. Names follow Hugging Face GPT-2
// ("transformer.h.0.attn.c_attn.weight"), so weights save to and load from its checkpoints.
//
// Parameters are declared first (name and shape) and materialised together: all values live in
// one flat buffer and all gradients in another, each parameter a view into them. The optimizer,
// gradient clipping and DDP's buckets then work on large contiguous ranges.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/graph.h"
#include "tensor/tensor.h"

namespace atl {

// What a parameter is for, declared where the parameter is declared: optimizers route by it (Muon
// takes the hidden matrices, AdamW or Ember the tables), parallelisms may shard by it. `automatic`
// (for parameters built outside a model) means: vector when 1-D, matrix otherwise.
enum class ParamRole { automatic, matrix, embedding, head, vector, expert };
const char* param_role_name(ParamRole r);
// automatic resolved by shape.
ParamRole resolve_role(ParamRole r, const Shape& shape);

// A parameter as the optimizer sees it: contiguous f32 value and gradient of the same shape.
struct ParamRef {
  std::string name;  // hierarchical, e.g. "transformer.h.0.attn.c_attn.weight"
  Tensor value;
  Tensor grad;
  ParamRole role = ParamRole::automatic;
};

}  // namespace atl

namespace atl::nn {

struct Parameter {
  std::string name;  // full hierarchical name
  Shape shape;
  ParamRole role = ParamRole::automatic;
  Tensor value;  // view into the flat value buffer, requires grad
  Tensor grad;   // view into the flat gradient buffer
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // All parameters of this module and its children, in declaration order.
  std::vector<Parameter*> parameters();
  Parameter* find(const std::string& full_name);
  int64_t num_params();
  // This module's prefix ("transformer.h.0"), empty for the root.
  const std::string& name() const { return prefix_; }
  // Every parameter as the optimizers see it (name, value, gradient, role).
  std::vector<ParamRef> param_refs();
  // The flat buffers all parameters and gradients are views into (set by materialize()).
  const Tensor& flat_values() const { return flat_values_; }
  const Tensor& flat_grads() const { return flat_grads_; }
  void zero_grad() { flat_grads_.zero(); }
  // Reallocates the flat buffers with only the parameters `keep` accepts (their values and
  // gradients copied, in the same order and alignment); the others lose their storage (value and
  // gradient undefined). A pipeline stage keeps its own parameters (parallel/pipeline.h). Views
  // taken of the old buffers (an optimizer's) keep the old storage: call it before making them.
  void retain_parameters(const std::function<bool(const Parameter&)>& keep);

 protected:
  explicit Module(std::string prefix) : prefix_(std::move(prefix)) {}
  Parameter* declare(const std::string& local_name, const Shape& shape, ParamRole role);
  std::string child_prefix(const std::string& local) const { return prefix_.empty() ? local : prefix_ + "." + local; }
  template <typename M, typename... A>
  M* child(const std::string& local, A&&... args) {
    auto m = std::make_unique<M>(child_prefix(local), std::forward<A>(args)...);
    M* raw = m.get();
    children_.push_back(std::move(m));
    return raw;
  }
  // Allocates the flat buffers and binds every declared parameter of the tree (call once, root).
  void materialize();
  const std::string& prefix() const { return prefix_; }

  Tensor flat_values_, flat_grads_;

 private:
  std::string prefix_;
  std::vector<std::unique_ptr<Parameter>> params_;
  std::vector<std::unique_ptr<Module>> children_;
};

}  // namespace atl::nn
