#include "parallel/ddp.h"

#include <chrono>

#include <fmt/format.h>

#include "autograd/graph.h"
#include "core/log.h"
#include "kernels/cpu/kernels.h"
#include "optim/clip.h"

namespace atl::parallel {

namespace {
double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

DDP::DDP(nn::Model& model, comm::Communicator* comm, int64_t bucket_elems, const AdamWConfig& ac,
         std::unique_ptr<Optimizer> opt, const comm::CodecSpec& codec)
    : DataParallel(model, comm) {
  opt_ = opt ? std::move(opt) : std::make_unique<AdamW>(model.param_refs(), ac);
  if (!codec.none() && (!comm_ || comm_->size() == 1))  // nothing to compress, but a typo is still one
    comm::make_codec(codec.codec, "parallel.codec" + (codec.where.empty() ? "" : " (" + codec.where + ")"));
  if (!comm_ || comm_->size() == 1) return;
  comm_->broadcast(model.flat_values(), 0);
  // Every rank states its codec (also "none"), so a rank that disagrees is refused now, by all.
  comm::exchange_codec_spec(*comm_, codec, "parallel.codec");
  layout_ = size_buckets(model, bucket_elems, 1, 0);
  if (!codec.none()) {
    compressor_ = std::make_unique<comm::CompressedAllReducer>(comm_, codec, false);
    for (const BucketLayout& b : layout_.buckets) {
      bucket_mats_.emplace_back();
      for (int i : b.params) {
        const Span& s = layout_.spans[size_t(i)];
        const Shape& sh = layout_.params[size_t(i)]->shape;
        if (sh.size() < 2 || s.lo < b.range.lo || s.hi > b.range.hi) continue;
        bucket_mats_.back().push_back({s.lo - b.range.lo, s.size() / sh.back(), sh.back()});
      }
    }
  }
  pending_.assign(layout_.buckets.size(), 0);
  work_.resize(layout_.buckets.size());
  ready_.assign(layout_.buckets.size(), false);
  for (size_t b = 0; b < layout_.buckets.size(); ++b) pending_[b] = int(layout_.buckets[b].params.size());
  for (size_t i = 0; i < layout_.params.size(); ++i)
    add_grad_hook(layout_.params[i]->value, [this, i](const Tensor&) { on_grad_ready(int(i)); });
}

DDP::~DDP() {
  if (compressor_) {
    const comm::CompressionStats& s = compressor_->stats();
    log::info("ddp codec {}: {} bytes sent by this rank in {} reductions, {:.2f}x fewer than f32 ({} bytes){}",
              compressor_->spec().codec, s.bytes_sent, s.calls, s.ratio(), s.f32_bytes,
              compressor_->gift() ? fmt::format("; GIFT on {} of {} matrices", s.gift_active, s.gift_matrices) : "");
  }
  for (nn::Parameter* p : layout_.params) clear_grad_hooks(p->value);
  // An exception may leave reductions in flight; they hold views of our buffers.
  for (auto& w : work_)
    if (w) try {
        w->wait();
      } catch (...) {
      }
}

void DDP::on_grad_ready(int param) {
  if (!sync_) return;
  for (int b : layout_.buckets_of_param[size_t(param)]) {
    ATOLL_CHECK(!work_[size_t(b)] && !ready_[size_t(b)],
                "DDP: a second backward with gradient sync on before finish_backward(); turn sync off "
                "(set_sync(false)) on gradient-accumulation micro-steps");
    if (--pending_[size_t(b)] == 0) launch(size_t(b));
  }
}

void DDP::launch(size_t b) {
  const Span& r = layout_.buckets[b].range;
  if (compressor_) {  // reduced in finish_backward
    ready_[b] = true;
    return;
  }
  work_[b] = comm_->all_reduce_async(model_.flat_grads().slice(0, r.lo, r.hi), comm::ReduceOp::sum);
}

void DDP::zero_grad() { model_.zero_grad(); }

void DDP::finish_backward() {
  if (!comm_ || comm_->size() == 1) {
    float d = take_grad_divisor();
    if (d != 1.f) cpu::scale_inplace(model_.flat_grads().f32(), d, model_.flat_grads().numel());
    return;
  }
  // Parameters that got no gradient (unused in this forward) leave their buckets pending.
  for (size_t b = 0; b < work_.size(); ++b)
    if (!work_[b] && !ready_[b]) launch(b);
  double t0 = now_s();
  for (size_t b = 0; b < work_.size(); ++b) {
    if (work_[b]) work_[b]->wait();
    work_[b].reset();
    if (compressor_) {
      ready_[b] = false;
      const Span& r = layout_.buckets[b].range;
      compressor_->all_reduce(model_.flat_grads().slice(0, r.lo, r.hi), comm::ReduceOp::sum, "bucket" + std::to_string(b),
                              bucket_mats_[b]);
    }
    pending_[b] = int(layout_.buckets[b].params.size());
  }
  timing_.wait_s += now_s() - t0;
  ++timing_.steps;
  cpu::scale_inplace(model_.flat_grads().f32(), take_grad_divisor(), model_.flat_grads().numel());
}

double DDP::time_reductions() {
  if (!comm_ || comm_->size() == 1) return 0;
  Tensor scratch = Tensor::zeros({model_.flat_grads().numel()});
  comm_->barrier();
  double t0 = now_s();
  for (auto& b : layout_.buckets) comm_->all_reduce(scratch.slice(0, b.range.lo, b.range.hi), comm::ReduceOp::sum);
  return now_s() - t0;
}

std::vector<std::pair<std::string, int64_t>> DDP::gradient_codec_tensors() const {
  std::vector<std::pair<std::string, int64_t>> out;
  if (compressor_)
    for (size_t b = 0; b < layout_.buckets.size(); ++b) out.emplace_back("bucket" + std::to_string(b), layout_.buckets[b].range.size());
  return out;
}

double DDP::grad_norm() { return atl::grad_norm(model_.flat_grads()); }

void DDP::step(const StepContext& ctx) { opt_->step(ctx); }

void DDP::full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                     std::vector<std::pair<std::string, Tensor>>& opt_state) {
  model_sd = model_.state_dict();
  opt_->save_state(opt_state, "");
}

void DDP::load_full_state(const std::vector<std::pair<std::string, Tensor>>& model_sd, const TensorFile& opt_state,
                          const std::string& what) {
  model_.load_state_dict(model_sd, what);
  opt_->load_state(opt_state, "");
}

}  // namespace atl::parallel
