#include "optim/adamw.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/kernels.h"

namespace atl {

namespace {
int64_t round_up(int64_t n) { return (n + 1023) / 1024 * 1024; }  // a moment starts on a 4 KiB page
}  // namespace

AdamW::AdamW(std::vector<ParamRef> params, AdamWConfig cfg) : params_(std::move(params)), cfg_(cfg) {
  auto round = round_up;
  int64_t total = 0;
  for (auto& p : params_) {
    ATOLL_CHECK(p.value.is_contiguous() && p.grad.is_contiguous() && p.value.dtype() == DType::f32,
                "adamw: parameter {} must be contiguous f32", p.name);
    off_.push_back(total);
    total += 2 * round(p.value.numel());
  }
  if (!cfg_.offload_dir.empty()) {
    ATOLL_CHECK(cfg_.stream_chunk >= 64 && cfg_.stream_chunk % 64 == 0,
                "adamw: stream_chunk = {} must be a positive multiple of 64", cfg_.stream_chunk);
    file_ = std::make_unique<StateFile>(cfg_.offload_dir, total);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Shape& s = params_[i].value.shape();
    if (file_) {
      m_.push_back(file_->view(off_[i], s));
      v_.push_back(file_->view(off_[i] + round(params_[i].value.numel()), s));
    } else {
      m_.push_back(Tensor::zeros(s));
      v_.push_back(Tensor::zeros(s));
    }
  }
}

void AdamW::step(const StepContext& ctx) {
  ++steps_;
  float lr = cfg_.lr * ctx.lr_scale;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    float wd = p.value.dim() >= 2 ? cfg_.weight_decay : 0.f;
    if (!file_) {
      cpu::adamw_step(p.value.f32(), p.grad.f32(), m_[i].f32(), v_[i].f32(), p.value.numel(), lr, cfg_.beta1,
                      cfg_.beta2, cfg_.eps, wd, ctx.grad_scale, steps_);
      continue;
    }
    // Streamed: a chunk's moments are paged in, updated and handed back before the next chunk.
    const int64_t n = p.value.numel(), vo = v_[i].f32() - file_->data();
    for (int64_t c = 0; c < n; c += cfg_.stream_chunk) {
      const int64_t k = std::min(cfg_.stream_chunk, n - c);
      cpu::adamw_step(p.value.f32() + c, p.grad.f32() + c, m_[i].f32() + c, v_[i].f32() + c, k, lr, cfg_.beta1,
                      cfg_.beta2, cfg_.eps, wd, ctx.grad_scale, steps_);
      file_->release(off_[i] + c, off_[i] + c + k);
      file_->release(vo + c, vo + c + k);
    }
    file_->release(off_[i], off_[i] + 2 * round_up(n));  // both moments to their padded ends
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
  if (file_) file_->release_all();
}

std::unique_ptr<Optimizer> make_adamw(std::vector<ParamRef> params, float lr, float beta1, float beta2, float eps,
                                      float weight_decay) {
  return std::make_unique<AdamW>(std::move(params), AdamWConfig{lr, beta1, beta2, eps, weight_decay});
}

}  // namespace atl
