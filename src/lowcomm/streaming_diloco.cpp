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
#include "lowcomm/codec_checkpoint.h"
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
    // A parameter's place in the flat buffer; each block's parameters are contiguous. Under pp a
    // stage's buffer holds its blocks only (the others' parameters are elsewhere or unbound): a
    // block keeps its index in the whole model, so its fragment is the one it has without pp.
    std::vector<std::pair<size_t, Range>> blocks;  // (index in the model, flat range)
    const float* base = flat_.f32();
    const size_t n_blocks = model_->blocks().size();
    for (size_t bi = 0; bi < n_blocks; ++bi) {
      int64_t lo = INT64_MAX, hi = 0;
      for (nn::Parameter* p : model_->blocks()[bi]->parameters()) {
        if (!in_flat(p)) continue;
        int64_t o = p->value.f32() - base;
        lo = std::min(lo, o);
        hi = std::max(hi, o + p->value.numel());
      }
      if (hi > lo) blocks.push_back({bi, {lo, hi}});
    }
    const int64_t P = c_.fragments;
    ATOLL_CHECK(P <= std::max<int64_t>(1, int64_t(n_blocks)),
                "lowcomm.fragments = {}: model family '{}' has {} blocks to split into fragments", P, model_->family(),
                n_blocks);
    frags_.assign(size_t(P), {});
    for (auto& [bi, r] : blocks) frags_[bi % size_t(P)].push_back(r);
    // Everything outside the blocks (embeddings, head, final norm) goes with fragment 0.
    std::vector<Range> all_blocks;
    for (auto& b : blocks) all_blocks.push_back(b.second);
    std::sort(all_blocks.begin(), all_blocks.end(), [](auto& a, auto& b) { return a.lo < b.lo; });
    int64_t at = 0;
    for (auto& r : all_blocks) {
      if (r.lo > at) frags_[0].push_back({at, r.lo});
      at = std::max(at, r.hi);
    }
    if (at < flat_.numel()) frags_[0].push_back({at, flat_.numel()});
    if (blocks.empty()) frags_[0] = {{0, flat_.numel()}};
    for (auto& f : frags_) std::sort(f.begin(), f.end(), [](auto& a, auto& b) { return a.lo < b.lo; });
    // What this rank holds of each (the same blocks on every tp rank and shard: the same model).
    for (auto& f : frags_) {
      Ranges scope;
      for (auto& r : f) scope.emplace_back(r.lo, r.hi);
      std::vector<Piece> h = held(scope);
      Ranges mine;
      for (const Piece& q : h) mine.emplace_back(q.flat, q.flat + q.len);
      scopes_.push_back(scope);
      held_.push_back(std::move(h));
      mats_.push_back(matrices_within(mine));
    }
    // pp: what every stage sends of each fragment (the job's bytes on the wire; a collective).
    if (pp_ > 1)
      for (int64_t p = 0; p < P; ++p) stage_frag_numel_.push_back(numel_per_stage(frag_numel(p)));
  }
  const std::vector<int64_t>* stage_sizes(int64_t p) const {
    return stage_frag_numel_.empty() ? nullptr : &stage_frag_numel_[size_t(p)];
  }

  // This rank's part of fragment p: all of it, or under ZeRO-3 / HSDP its owned chunks of it.
  int64_t frag_numel(int64_t p) const {
    int64_t n = 0;
    for (const Piece& q : held_[size_t(p)]) n += q.len;
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
      out.push_back(record(fmt::format("fragment {}", pd.frag), pd.buf.numel(), since(t0), since(pd.started),
                           stage_sizes(pd.frag)));
      pending_.pop_front();
    }
    // Fragments whose round ends with this step: start their exchange.
    for (int64_t p = 0; p < int64_t(frags_.size()); ++p) {
      if ((step + 1 - offset(p)) % H != 0 || step + 1 < offset(p)) continue;
      auto t0 = Clock::now();
      Pending pd{p, step + c_.overlap_steps, Tensor::empty({frag_numel(p)}), nullptr, t0};
      float* d = pd.buf.f32();
      const float *x = flat_.f32(), *g = global_.f32();
      for (const Piece& q : held_[size_t(p)])
        for (int64_t i = 0; i < q.len; ++i) *d++ = g[q.at + i] - x[q.flat + i];
      pd.finish = start_average(pd.buf, fmt::format("fragment{}", p), mats_[size_t(p)]);
      if (c_.overlap_steps == 0) {
        pd.finish();
        pd.finish = nullptr;
        apply(pd);
        ++outer_steps_;
        out.push_back(record(fmt::format("fragment {}", p), pd.buf.numel(), since(t0), since(t0), stage_sizes(p)));
      } else {
        pending_.push_back(std::move(pd));
      }
    }
    if (out.empty()) return nullptr;
    return out.size() == 1 ? out[0] : out;
  }

  void apply(Pending& pd) {
    // tp: the replicated parameters' means made tp rank 0's (as DiLoCo; a no-op without tp).
    // (A stage holding none of the fragment, under pp, has an empty scope: nothing to agree.)
    agree_over_tp(pd.buf, scopes_[size_t(pd.frag)], fmt::format("fragment{}", pd.frag));
    // pp: the tied embedding's copies are in fragment 0 on the first and last stages.
    if (pd.frag == 0) agree_over_pp(pd.buf, &held_[0]);
    const float* d = pd.buf.f32();
    float *x = flat_.f32(), *g = global_.f32(), *b = mom_.f32();
    const float a = float(c_.mixing);
    for (const Piece& q : held_[size_t(pd.frag)]) {
      outer_sgd(g + q.at, b + q.at, d, q.len, c_);
      if (a == 0.f) std::memcpy(x + q.flat, g + q.at, size_t(q.len) * sizeof(float));
      else
        for (int64_t i = 0; i < q.len; ++i) x[q.flat + i] = a * x[q.flat + i] + (1.f - a) * g[q.at + i];
      d += q.len;
    }
  }

  void save_method(std::vector<std::pair<std::string, Tensor>>& out, nlohmann::json& st) override {
    nlohmann::json list = nlohmann::json::array();
    NamedTensors mine;
    for (size_t i = 0; i < pending_.size(); ++i) {
      Pending& pd = pending_[i];
      if (pd.finish) {  // completing early changes no value: the mean is applied when due
        pd.finish();
        pd.finish = nullptr;
      }
      mine.emplace_back(std::to_string(i), pd.buf.clone());
      list.push_back({{"fragment", pd.frag}, {"apply_at", pd.apply_at}});
    }
    // The means are the same on every island; inside one they are per shard under tp / ZeRO-3
    // (lowcomm.pending.rank<r>.<i>, r the rank in the group), whole otherwise (lowcomm.pending.<i>).
    if (comm::Communicator* g = outer_state_group())
      gather_rank_tensors(g, mine, "lowcomm.pending.", out);
    else
      for (auto& [i, t] : mine) out.emplace_back("lowcomm.pending." + i, t);
    st["pending"] = list;
    st["fragments"] = frags_.size();
  }

  void load_method(const TensorFile& f, const nlohmann::json& st, const std::string& what) override {
    ATOLL_CHECK(st.at("fragments").get<size_t>() == frags_.size(),
                "{} was saved with lowcomm.fragments = {}, this job has {}", what, st.at("fragments").get<size_t>(),
                frags_.size());
    pending_.clear();
    size_t i = 0;
    comm::Communicator* g = outer_state_group();
    const std::string prefix = g ? fmt::format("lowcomm.pending.rank{}.", g->rank()) : "lowcomm.pending.";
    for (auto& e : st.at("pending")) {
      Pending pd{e.at("fragment").get<int64_t>(), e.at("apply_at").get<int64_t>(),
                 f.get(prefix + std::to_string(i++)).clone(), nullptr, Clock::now()};
      ATOLL_CHECK(pd.buf.numel() == frag_numel(pd.frag), "{}: {}{} has {} elements, this rank's part of fragment {} "
                  "{}", what, prefix, i - 1, pd.buf.numel(), pd.frag, frag_numel(pd.frag));
      pending_.push_back(std::move(pd));
    }
  }

 private:
  std::vector<std::vector<Range>> frags_;
  std::vector<Ranges> scopes_;               // each fragment's flat ranges
  std::vector<std::vector<Piece>> held_;     // what this rank holds of each, in its buffer's order
  std::vector<std::vector<comm::MatrixSpan>> mats_;  // the whole matrices in each buffer (GIFT)
  std::vector<std::vector<int64_t>> stage_frag_numel_;  // pp: [fragment][stage] what each stage sends
  std::deque<Pending> pending_;
};
}  // namespace

std::unique_ptr<LowComm> make_streaming_diloco(const LowCommConfig& c, parallel::Mesh& mesh,
                                               comm::Communicator* world, Config& cfg) {
  return std::make_unique<StreamingDiLoCo>(c, mesh, world, cfg);
}

}  // namespace atl::lowcomm
