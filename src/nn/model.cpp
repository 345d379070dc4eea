#include "nn/model.h"

#include "autograd/graph.h"
#include "kernels/cpu/kernels.h"

namespace atl::nn {

double Model::flops_per_token(int64_t T) const {
  // 6 per matmul parameter (forward 2, backward 4); lookups and gains are free.
  double n = 0;
  for (Parameter* p : const_cast<Model*>(this)->parameters())
    if (p->role == ParamRole::matrix || p->role == ParamRole::head || p->role == ParamRole::expert)
      n += double(shape_numel(p->shape));
  return 6.0 * n;
}

const char* parallel_style_name(ParallelStyle s) {
  switch (s) {
    case ParallelStyle::shard_unit: return "shard_unit";
    case ParallelStyle::colwise: return "colwise";
    case ParallelStyle::rowwise: return "rowwise";
    case ParallelStyle::vocab_rowwise: return "vocab_rowwise";
    case ParallelStyle::expert: return "expert";
    case ParallelStyle::sequence: return "sequence";
  }
  return "?";
}

ParallelPlan Model::parallelize() const {
  ParallelPlan plan;
  for (Module* b : const_cast<Model*>(this)->blocks()) plan.add(b->name(), ParallelStyle::shard_unit);
  return plan;
}

const StateDictAdapter& Model::state_dict_adapter() const {
  static const StateDictAdapter identity;
  return identity;
}

std::vector<std::pair<std::string, Tensor>> Model::state_dict() {
  const StateDictAdapter& a = state_dict_adapter();
  std::vector<std::pair<std::string, Tensor>> sd;
  for (Parameter* p : parameters()) sd.emplace_back(a.to_file(p->name), p->value);
  return sd;
}

void Model::load_state_dict(const std::vector<std::pair<std::string, Tensor>>& sd, const std::string& what) {
  const StateDictAdapter& a = state_dict_adapter();
  std::map<std::string, const Tensor*> by;
  for (auto& [n, t] : sd) by[a.from_file(n)] = &t;
  for (Parameter* p : parameters()) {
    auto it = by.find(p->name);
    ATOLL_CHECK(it != by.end(), "{}: missing weight '{}'", what, a.to_file(p->name));
    ATOLL_CHECK(it->second->shape() == p->shape, "{}: weight '{}' has shape {}, the model expects {}", what,
                a.to_file(p->name), shape_str(it->second->shape()), shape_str(p->shape));
    p->value.copy_from(*it->second);
    by.erase(it);
  }
  for (auto it = by.begin(); it != by.end();) it = a.ignorable(a.to_file(it->first)) ? by.erase(it) : std::next(it);
  ATOLL_CHECK(by.empty(), "{}: unexpected weight '{}' (model: {})", what, by.empty() ? "" : a.to_file(by.begin()->first),
              describe());
}

std::map<std::string, std::string> Model::config_metadata() const {
  return {{"format", "pt"}, {"atoll_family", family()}};
}

void Model::begin_forward() const {
  if (hooks_) hooks_->forward_begin();
}

namespace {
// A pass-through node whose backward calls a block hook: placed after a block it runs when the
// block's backward begins, placed before it when that backward has ended.
Tensor hook_marker(const Tensor& x, BlockHooks* h, int64_t block, bool at_block_output) {
  Tensor out = x.view(x.shape());
  record("block_hook", out, {x}, [h, block, at_block_output](Node& n) {
    if (at_block_output) h->before_backward(block);
    Tensor g = grad_of(n.output);
    Tensor& in = n.inputs[0];
    if (!grad_of(in).defined()) in.autograd()->grad = g;  // hand the buffer on, no copy
    else cpu::add_inplace(grad_buffer(in).f32(), g.f32(), g.numel());
    if (!at_block_output) h->after_backward(block);
  });
  return out;
}
}  // namespace

Tensor Model::run_blocks(Tensor x, size_t n, const std::function<Tensor(size_t, const Tensor&)>& block_fn) const {
  // A "full" block keeps only its input and reruns in backward (the closure outlives this call).
  auto block = [this, &block_fn](size_t i, const Tensor& in) {
    if (recompute(i) != Recompute::full || !grad_enabled()) return block_fn(i, in);
    return checkpoint("recompute_block", in, [i, f = block_fn](const Tensor& xi) { return f(i, xi); });
  };
  for (size_t i = 0; i < n; ++i) {
    if (!hooks_) {
      x = block(i, x);
      continue;
    }
    int64_t bi = int64_t(i);
    hooks_->before_forward(bi);
    bool rec = should_record({&x});
    if (rec) x = hook_marker(x, hooks_, bi, false);
    x = block(i, x);
    if (rec) x = hook_marker(x, hooks_, bi, true);
    hooks_->after_forward(bi);
  }
  return x;
}

Registry<ModelFamily>& model_registry() {
  static Registry<ModelFamily> r("model family");
  return r;
}

std::unique_ptr<Model> make_model(Config& cfg, const std::string& section) {
  return model_registry().lookup(cfg, section + ".family", "gpt").from_config(cfg, section);
}

std::unique_ptr<Model> model_from_metadata(const std::map<std::string, std::string>& md) {
  auto it = md.find("atoll_family");
  return model_registry().get(it == md.end() ? "gpt" : it->second, "weights metadata atoll_family").from_metadata(md);
}

}  // namespace atl::nn
