// AdamW over one rank's shard of the flat buffers (ZeRO's optimizer-state partitioning). The shard
// cuts parameters at arbitrary points, so each piece is its own AdamW parameter: pieces of
// matrices are shaped [1, n] so weight decay still applies to them (AdamW decays parameters of two
// or more dimensions), pieces of vectors [n]. AdamW is elementwise, so the update equals the
// unsharded one. State is saved and loaded in the unsharded layout (param.exp_avg, ...), gathered
// over the sharding group.
#pragma once
#include <functional>

#include "optim/adamw.h"
#include "parallel/optim/sharded_optimizer.h"

namespace atl::parallel {

class ShardedAdamW final : public ShardedOptimizer {
 public:
  // The pieces are this rank's `own` spans of the layout's buckets, of the parameters `take`
  // accepts (all when empty). The full state is named prefix + "step", prefix + param + ".exp_avg",
  // ... (prefix "" for AdamW on everything; "adamw." as a group of GroupedOptimizer).
  ShardedAdamW(nn::Model& model, const FlatLayout& layout, const AdamWConfig& cfg,
               const std::function<bool(int param)>& take = {}, std::string prefix = "");
  std::string name() const override { return "adamw"; }
  void step(const StepContext& ctx) override {
    ++steps_;
    inner_->step(ctx);
  }
  // Sharded state (piece names); used by nothing but tests.
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override {
    inner_->save_state(out, prefix);
  }
  void load_state(const TensorFile& f, const std::string& prefix) override { inner_->load_state(f, prefix); }

  void save_full_state(std::vector<std::pair<std::string, Tensor>>& out, comm::Communicator* group) const override;
  void load_full_state(const TensorFile& f) override;

 private:
  struct Piece {
    int param;
    Span span;
    std::string name;
  };
  const FlatLayout& layout_;
  std::vector<bool> taken_;  // per layout parameter
  std::string prefix_;
  std::vector<Piece> pieces_;
  std::unique_ptr<AdamW> inner_;
};

}  // namespace atl::parallel
