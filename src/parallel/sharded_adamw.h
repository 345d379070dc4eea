// AdamW over one rank's shard of the flat buffers (ZeRO's optimizer-state partitioning). The shard
// cuts parameters at arbitrary points, so each piece is its own AdamW parameter: pieces of
// matrices are shaped [1, n] so weight decay still applies to them (AdamW decays parameters of two
// or more dimensions), pieces of vectors [n]. AdamW is elementwise, so the update equals the
// unsharded one. State is saved and loaded in the unsharded layout (param.exp_avg, ...), gathered
// over the sharding group.
#pragma once
#include "comm/communicator.h"
#include "optim/adamw.h"
#include "parallel/flat_layout.h"

namespace atl::parallel {

class ShardedAdamW final : public Optimizer {
 public:
  // The pieces are this rank's `own` spans of the layout's buckets.
  ShardedAdamW(nn::GPT& model, const FlatLayout& layout, const AdamWConfig& cfg);
  std::string name() const override { return "adamw"; }
  void step(const StepContext& ctx) override { inner_->step(ctx); }
  // Sharded state (piece names); used by nothing but tests.
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override {
    inner_->save_state(out, prefix);
  }
  void load_state(const TensorFile& f, const std::string& prefix) override { inner_->load_state(f, prefix); }

  // Collective over `group` (the sharding group; null for one rank): the full state, every rank.
  void save_full_state(std::vector<std::pair<std::string, Tensor>>& out, comm::Communicator* group) const;
  void load_full_state(const TensorFile& f);

 private:
  struct Piece {
    int param;
    Span span;
    std::string name;
  };
  const FlatLayout& layout_;
  std::vector<Piece> pieces_;
  std::unique_ptr<AdamW> inner_;
};

}  // namespace atl::parallel
