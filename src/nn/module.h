// Modules: a tree of named parts owning parameters. Names follow Hugging Face GPT-2
// ("transformer.h.0.attn.c_attn.weight"), so weights save to and load from its checkpoints.
//
// Parameters are declared first (name and shape) and materialised together: all values live in
// one flat buffer and all gradients in another, each parameter a view into them. The optimizer,
// gradient clipping and DDP's buckets then work on large contiguous ranges.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "autograd/graph.h"
#include "tensor/tensor.h"

namespace atl::nn {

struct Parameter {
  std::string name;  // full hierarchical name
  Shape shape;
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

 protected:
  explicit Module(std::string prefix) : prefix_(std::move(prefix)) {}
  Parameter* declare(const std::string& local_name, const Shape& shape);
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
