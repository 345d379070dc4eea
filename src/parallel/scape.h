// SCAPE (seed: "SCAPE: Accurate and Efficient LLM Training with Extreme Sparse Communication"), a
// data-parallel strategy ("scape") with AdamS (optim/adams.h) on every parameter, whose gradient
// exchange is sparse:
//  - each rank keeps its unsent gradient (e += g, error feedback) and, every step, sends only the
//    coordinates of a shared mask: one all-reduce of the packed values (the one synchronized
//    sparse buffer); AdamS rebuilds its denominator from that buffer and its own first moment
//    (v = beta2 m^2 + (1 - beta2) g^2), so no second collective for second-moment quantities;
//  - the mask comes from first-moment statistics, |beta1 m + (1 - beta1) e| (the first moment a
//    coordinate would have with its pending gradient delivered), not from the raw gradient;
//  - mask generation is partitioned: rank r picks the top (1 - sparsity) fraction of its 1/W
//    shard of the flat parameters (the shard ZeRO would give it) and all-gathers the indices
//    (as a bitmap when that is smaller);
//  - each mask is used one step late: made after step t's update, gathered asynchronously during
//    step t+1's forward and backward, used by step t+1's exchange. The first step, with no mask
//    yet, is dense.
// Checkpoints hold, besides AdamS's state, the next mask and every rank's unsent gradient, so a
// stopped run resumes bit-exact (on another world size rank 0 takes the summed residuals).
// Coordinates outside the mask keep their first moment and weights (lazy, like SparseAdam) apart
// from weight decay, which applies every step; or (scape_update = "dense") AdamS steps them all
// on the sparse buffer. At sparsity 0 every coordinate is sent every step
// and the strategy is DDP with AdamS (equal bitwise on two ranks: a two-term sum is exact in
// any order). The mask-selection statistic and the lazy update are this implementation's reading
// of the abstract, not the paper's code.
#pragma once
#include "optim/adams.h"
#include "parallel/data_parallel.h"

namespace atl::parallel {

struct ScapeStats {
  int64_t steps = 0;
  int64_t value_bytes = 0, index_bytes = 0;  // sent by this rank
  int64_t dense_bytes = 0;  // what DDP's f32 ring all-reduce would have sent
  double ratio() const { return dense_bytes ? double(value_bytes + index_bytes) / double(dense_bytes) : 0.0; }
};

class ScapeAdamS;
class Scape final : public DataParallel {
 public:
  // lazy: coordinates outside the mask keep their weights and first moment (but decay); dense:
  // AdamS steps every coordinate on the sparse buffer (zero outside the mask), its momentum
  // carrying unmasked coordinates on.
  Scape(nn::Model& model, comm::Communicator* comm, const AdamSConfig& cfg, double sparsity, bool lazy = true);
  ~Scape() override;
  std::string name() const override { return "scape"; }
  void zero_grad() override;
  void finish_backward() override;
  double grad_norm() override;
  void step(const StepContext& ctx) override;
  void full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                  std::vector<std::pair<std::string, Tensor>>& opt_state) override;
  void load_full_state(const std::vector<std::pair<std::string, Tensor>>& model_sd, const TensorFile& opt_state,
                       const std::string& what) override;
  const ScapeStats& stats() const { return stats_; }
  int64_t mask_size() const;  // coordinates the next exchange sends

 private:
  void make_next_mask();
  void take_gathered_mask();

  ScapeAdamS* opt();
  double sparsity_;
  bool lazy_;
  int64_t n_ = 0, shard_ = 0, kmax_ = 0, words_ = 0;
  bool bitmap_ = false;
  std::vector<float> residual_;
  std::vector<int32_t> mask_;  // sorted flat indices; empty with dense_
  bool dense_ = true;
  Tensor mine_, gathered_;
  comm::WorkPtr pending_;
  ScapeStats stats_;
};

}  // namespace atl::parallel
