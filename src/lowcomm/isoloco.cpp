// IsoLoCo ("Can Model Merging Improve Aggregation in DiLoCo?"): DiLoCo whose averaged
// pseudo-gradient is merged by Iso-C (iso_merge.h) per 2-D matrix before the outer Nesterov SGD;
// vectors (norms, biases) stay averaged, and so, unless lowcomm.merge_scope = "all", do the
// embedding and head matrices. Iso-C acts on the mean rather than the sum of the
// islands' pseudo-gradients (the sum's spectrum scaled by 1/M), so outer_lr keeps DiLoCo's
// meaning. Ablations: lowcomm.merge = "average" (plain averaging, i.e. DiLoCo) and
// lowcomm.outer_momentum = 0 (Iso-C without momentum, the paper's "DiLoCo SGD with Iso-C").
#include <fmt/format.h>

#include "lowcomm/diloco.h"
#include "lowcomm/iso_merge.h"
#include "parallel/tensor_parallel.h"

namespace atl::lowcomm {

namespace {
class IsoLoCo final : public DiLoCo {
 public:
  using DiLoCo::DiLoCo;
  std::string describe() const override {
    return DiLoCo::describe() + ", merge " + c_.merge + (c_.merge == "iso_c" ? " (" + c_.merge_scope + " matrices)" : "");
  }

 protected:
  void merge(Tensor& delta) override {
    if (c_.merge != "iso_c") return;
    const float* base = flat_.f32();
    Ranges want;
    std::vector<nn::Parameter*> mats;
    for (nn::Parameter* p : model_->parameters()) {
      if (p->shape.size() != 2) continue;
      // pp inside the islands: the other stages' matrices are not in this rank's flat buffer
      // (unbound, or allocated elsewhere); each stage merges its own, whole (pipeline_islands.cpp).
      if (!in_flat(p)) continue;
      // Embedding and head rows of tokens a round never saw carry no signal; Iso-C would give
      // them the mean singular value's weight, so by default only the hidden matrices merge so.
      if (c_.merge_scope == "hidden" && resolve_role(p->role, p->shape) != ParamRole::matrix) continue;
      const int64_t o = p->value.f32() - base;
      want.emplace_back(o, o + p->shape[0] * p->shape[1]);
      mats.push_back(p);
    }
    const bool split = tp_ctx_ && tp_ctx_->size() > 1;
    if (owned_.empty() && !split) {  // delta is the whole model
      for (size_t i = 0; i < want.size(); ++i) iso_c(delta.f32() + want[i].first, mats[i]->shape[0], mats[i]->shape[1]);
      return;
    }
    // ZeRO-3 / HSDP: this rank's chunks cut the matrices, whose SVD needs them whole. The shard
    // group makes the merged matrices whole on each of its ranks (their means are the same bits
    // on every rank, and Iso-C is deterministic), each merges them all, keeps its own pieces.
    // Costs, per sync, an all-reduce of the merged matrices over the island's fast links and
    // their size in memory while it runs (ZeRO-3 holds only its chunks otherwise).
    // tp: each matrix is then this tp rank's piece of it (its shard's shape), which the tp group
    // gathers whole (TensorParallel::gather, by the plan's split rule: the same bits on every
    // tp rank); every tp rank merges the whole matrix alike and keeps its own piece, so the result
    // is the merge of the job without tp. Costs an all-gather of the split matrices over the tp
    // group, a whole matrix in memory at a time, and tp times the SVD work (each tp rank repeats
    // it; the SVDs are a small part of a sync's time at the sizes trained across islands here).
    const std::vector<Piece> layout = held({{0, flat_.numel()}});
    Tensor whole = gather_whole(delta, layout, want, "iso_c");
    int64_t at = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      nn::Parameter* p = mats[i];
      const int64_t n = want[i].second - want[i].first;
      Tensor mine = whole.slice(0, at, at + n);
      if (split && tp_ctx_->sharded(p)) {
        Tensor full = tp_ctx_->gather(p->name, mine.view(p->shape));
        iso_c(full.f32(), full.shape()[0], full.shape()[1]);
        mine.copy_from(tp_ctx_->take(p->name, full).reshape({n}));
      } else {
        iso_c(mine.f32(), p->shape[0], p->shape[1]);
      }
      at += n;
    }
    scatter_whole(whole, delta, layout, want);
  }
};
}  // namespace

std::unique_ptr<LowComm> make_isoloco(const LowCommConfig& c, parallel::Mesh& mesh, comm::Communicator* world,
                                      Config& cfg) {
  return std::make_unique<IsoLoCo>(c, mesh, world, cfg);
}

}  // namespace atl::lowcomm
