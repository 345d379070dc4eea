#include "optim/adamw.h"

#include <cstring>

#include "kernels/cpu/kernels.h"

namespace atl {

AdamW::AdamW(std::vector<ParamRef> params, AdamWConfig cfg) : params_(std::move(params)), cfg_(cfg) {
  for (auto& p : params_) {
    ATOLL_CHECK(p.value.is_contiguous() && p.grad.is_contiguous() && p.value.dtype() == DType::f32,
                "adamw: parameter {} must be contiguous f32", p.name);
    m_.push_back(Tensor::zeros(p.value.shape()));
    v_.push_back(Tensor::zeros(p.value.shape()));
  }
}

void AdamW::step(const StepContext& ctx) {
  ++steps_;
  float lr = cfg_.lr * ctx.lr_scale;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    float wd = p.value.dim() >= 2 ? cfg_.weight_decay : 0.f;
    cpu::adamw_step(p.value.f32(), p.grad.f32(), m_[i].f32(), v_[i].f32(), p.value.numel(), lr, cfg_.beta1, cfg_.beta2,
                    cfg_.eps, wd, ctx.grad_scale, steps_);
  }
}

void AdamW::save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const {
  Tensor st = Tensor::empty({1}, DType::i64);
  *st.data<int64_t>() = steps_;
  out.emplace_back(prefix + "step", st);
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(prefix + params_[i].name + ".exp_avg", m_[i]);
    out.emplace_back(prefix + params_[i].name + ".exp_avg_sq", v_[i]);
  }
}

void AdamW::load_state(const TensorFile& f, const std::string& prefix) {
  steps_ = *f.get(prefix + "step").data<int64_t>();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& m = f.get(prefix + params_[i].name + ".exp_avg");
    const Tensor& v = f.get(prefix + params_[i].name + ".exp_avg_sq");
    ATOLL_CHECK(m.shape() == m_[i].shape() && v.shape() == v_[i].shape(),
                "adamw state for {} has shape {}, the parameter {}", params_[i].name, shape_str(m.shape()),
                shape_str(m_[i].shape()));
    m_[i].copy_from(m);
    v_[i].copy_from(v);
  }
}

std::unique_ptr<Optimizer> make_adamw(std::vector<ParamRef> params, float lr, float beta1, float beta2, float eps,
                                      float weight_decay) {
  return std::make_unique<AdamW>(std::move(params), AdamWConfig{lr, beta1, beta2, eps, weight_decay});
}

}  // namespace atl
