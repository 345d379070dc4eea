// Streaming DiLoCo (Douillard et al., "Streaming DiLoCo with overlapping communication: Towards
// a Distributed Free Lunch", 2025): the parameters in P fragments (strided by blocks: fragment p
// holds blocks p, p + P, ...; parameters outside the blocks go with fragment 0), fragment p synced
// every H steps at offset (p + 1) H / P, so the WAN carries 1/P of the model at a time. A
// fragment's exchange starts after the inner step that ends its round and is applied tau inner
// steps later (overlapping them), merged into the local parameters with mixing factor alpha:
//   theta_local <- alpha theta_local + (1 - alpha) theta_global.
// With P = 1, tau = 0 and alpha = 0 it is DiLoCo.
#include <fmt/format.h>

#include <cstring>
#include <deque>

#include "core/log.h"
#include "lowcomm/diloco.h"

namespace atl::lowcomm {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Range {
  int64_t lo, hi;
};

class StreamingDiLoCo final : public LowComm {
 public:
  using LowComm::LowComm;

  std::string describe() const override {
    return fmt::format("streaming over {} islands, H = {}, {} fragments, overlap {} steps, mixing {}, outer "
                       "{}SGD lr {} momentum {}, exchange {}",
                       islands_, c_.inner_steps, frags_.size(), c_.overlap_steps, c_.mixing,
                       c_.nesterov && c_.outer_momentum > 0 ? "Nesterov " : "", c_.outer_lr, c_.outer_momentum,
                       describe_exchange(c_.codec));
  }

 protected:
  struct Pending {
    int64_t frag, apply_at;  // applied after the optimizer step of apply_at (0-based)
    Tensor buf;              // the fragment's pseudo-gradient, then its island mean
    std::function<void()> finish;  // null once complete
    Clock::time_point started;
  };

  void on_attach() override {
    // A parameter's place in the flat buffer; each block's parameters are contiguous.
    std::vector<Range> blocks;
    std::vector<bool> in_block(size_t(flat_.numel()), false);
    const float* base = flat_.f32();
    for (nn::Module* b : model_->blocks()) {
      int64_t lo = INT64_MAX, hi = 0;
      for (nn::Parameter* p : b->parameters()) {
        int64_t o = p->value.f32() - base;
        lo = std::min(lo, o);
        hi = std::max(hi, o + p->value.numel());
      }
      if (hi > lo) blocks.push_back({lo, hi});
    }
    const int64_t P = c_.fragments;
    ATOLL_CHECK(P <= std::max<int64_t>(1, int64_t(blocks.size())),
                "lowcomm.fragments = {}: model family '{}' has {} blocks to split into fragments", P, model_->family(),
                blocks.size());
    frags_.assign(size_t(P), {});
    for (size_t b = 0; b < blocks.size(); ++b) frags_[b % size_t(P)].push_back(blocks[b]);
    // Everything outside the blocks (embeddings, head, final norm) goes with fragment 0.
    std::vector<Range> all_blocks = blocks;
    std::sort(all_blocks.begin(), all_blocks.end(), [](auto& a, auto& b) { return a.lo < b.lo; });
    int64_t at = 0;
    for (auto& r : all_blocks) {
      if (r.lo > at) frags_[0].push_back({at, r.lo});
      at = std::max(at, r.hi);
    }
    if (at < flat_.numel()) frags_[0].push_back({at, flat_.numel()});
    if (blocks.empty()) frags_[0] = {{0, flat_.numel()}};
    for (auto& f : frags_) std::sort(f.begin(), f.end(), [](auto& a, auto& b) { return a.lo < b.lo; });
  }

  int64_t frag_numel(int64_t p) const {
    int64_t n = 0;
    for (auto& r : frags_[size_t(p)]) n += r.hi - r.lo;
    return n;
  }
  int64_t offset(int64_t p) const { return (p + 1) * c_.inner_steps / int64_t(frags_.size()); }

  nlohmann::json sync(int64_t step) override {
    nlohmann::json out = nlohmann::json::array();
    const int64_t H = c_.inner_steps;
    // Exchanges due now: complete them (waiting counts against compute) and merge.
    while (!pending_.empty() && pending_.front().apply_at == step) {
      Pending& pd = pending_.front();
      auto t0 = Clock::now();
      if (pd.finish) pd.finish();
      apply(pd);
      ++outer_steps_;
      out.push_back(record(fmt::format("fragment {}", pd.frag), pd.buf.numel(), since(t0), since(pd.started)));
      pending_.pop_front();
    }
    // Fragments whose round ends with this step: start their exchange.
    for (int64_t p = 0; p < int64_t(frags_.size()); ++p) {
      if ((step + 1 - offset(p)) % H != 0 || step + 1 < offset(p)) continue;
      auto t0 = Clock::now();
      Pending pd{p, step + c_.overlap_steps, Tensor::empty({frag_numel(p)}), nullptr, t0};
      float* d = pd.buf.f32();
      const float *x = flat_.f32(), *g = global_.f32();
      for (auto& r : frags_[size_t(p)])
        for (int64_t i = r.lo; i < r.hi; ++i) *d++ = g[i] - x[i];
      std::vector<std::pair<int64_t, int64_t>> ranges;
      for (auto& r : frags_[size_t(p)]) ranges.push_back({r.lo, r.hi});
      pd.finish = start_average(pd.buf, fmt::format("fragment{}", p), matrices_within(ranges));
      if (c_.overlap_steps == 0) {
        pd.finish();
        apply(pd);
        ++outer_steps_;
        out.push_back(record(fmt::format("fragment {}", p), pd.buf.numel(), since(t0), since(t0)));
      } else {
        pending_.push_back(std::move(pd));
      }
    }
    if (out.empty()) return nullptr;
    return out.size() == 1 ? out[0] : out;
  }

  void apply(Pending& pd) {
    const float* d = pd.buf.f32();
    float *x = flat_.f32(), *g = global_.f32(), *b = mom_.f32();
    const float a = float(c_.mixing);
    for (auto& r : frags_[size_t(pd.frag)]) {
      const int64_t n = r.hi - r.lo;
      outer_sgd(g + r.lo, b + r.lo, d, n, c_);
      if (a == 0.f) std::memcpy(x + r.lo, g + r.lo, size_t(n) * sizeof(float));
      else
        for (int64_t i = r.lo; i < r.hi; ++i) x[i] = a * x[i] + (1.f - a) * g[i];
      d += n;
    }
  }

  void save_method(std::vector<std::pair<std::string, Tensor>>& out, nlohmann::json& st) override {
    nlohmann::json list = nlohmann::json::array();
    for (size_t i = 0; i < pending_.size(); ++i) {
      Pending& pd = pending_[i];
      if (pd.finish) {  // completing early changes no value: the mean is applied when due
        pd.finish();
        pd.finish = nullptr;
      }
      out.emplace_back(fmt::format("lowcomm.pending.{}", i), pd.buf.clone());
      list.push_back({{"fragment", pd.frag}, {"apply_at", pd.apply_at}});
    }
    st["pending"] = list;
    st["fragments"] = frags_.size();
  }

  void load_method(const TensorFile& f, const nlohmann::json& st, const std::string& what) override {
    ATOLL_CHECK(st.at("fragments").get<size_t>() == frags_.size(),
                "{} was saved with lowcomm.fragments = {}, this job has {}", what, st.at("fragments").get<size_t>(),
                frags_.size());
    pending_.clear();
    size_t i = 0;
    for (auto& e : st.at("pending")) {
      Pending pd{e.at("fragment").get<int64_t>(), e.at("apply_at").get<int64_t>(),
                 f.get(fmt::format("lowcomm.pending.{}", i++)).clone(), nullptr, Clock::now()};
      pending_.push_back(std::move(pd));
    }
  }

 private:
  std::vector<std::vector<Range>> frags_;
  std::deque<Pending> pending_;
};
}  // namespace

std::unique_ptr<LowComm> make_streaming_diloco(const LowCommConfig& c, parallel::Mesh& mesh,
                                               comm::Communicator* world, Config& cfg) {
  return std::make_unique<StreamingDiLoCo>(c, mesh, world, cfg);
}

}  // namespace atl::lowcomm
