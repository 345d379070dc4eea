// Periodic Row-wise Muon ("Scaling Muon for Diffusion Transformers") on row-sharded momentum, in
// the ZeRO-2 style: rank r keeps only its block of storage rows of each matrix's momentum.
//
//  - gradients: one reduce-scatter (avg) per bucket delivers each rank its rows of the averaged
//    gradient (reduce_grads = true), or each rank takes its rows of an already-averaged gradient
//    (reduce_grads = false, under DDP);
//  - non-refresh steps: momentum, row normalization and the update touch only the rank's rows
//    (a row's norm is local to the row), so there is no communication beyond the gradient
//    reduction and the usual ZeRO all-gather of the updated parameter rows;
//  - refresh steps (1, K+1, 2K+1, ...): the Nesterov momentum rows are all-gathered in buckets
//    (all buckets issued before the first wait), each matrix is orthogonalized by its owner
//    (longest-processing-time-first, as in muon_owner.h) and the updates are shared with one
//    all_gather; every rank then applies every update to the full parameters.
// Every row is computed by exactly the operations single-rank PeriodicRowMuon applies to it, so
// the parameters equal its result. Only axis = rows is supported (columns would need a reduction
// of the column norms across the row shards).
// row_scale = "fit": each owner fits its matrices' row-step scale at a refresh (it holds the whole
// momentum and update) and one all_reduce of #matrices floats shares them.
// State is saved as PeriodicRowMuon's (full momentum tensors); save_state is collective.
#pragma once
#include "comm/communicator.h"
#include "optim/periodic_row_muon.h"
#include "parallel/optim/muon_owner.h"

namespace atl::parallel {

// Rank r's block of rows of an m-row matrix: [lo, hi), blocks of ceil(m / world) rows.
struct RowBlock {
  int64_t lo = 0, hi = 0;
  int64_t size() const { return hi - lo; }
};
RowBlock row_block(int64_t rows, int rank, int world);

// Matrices grouped into buckets; within a bucket, chunk r of a [world * chunk] buffer holds rank
// r's row block of each matrix at the same offset `within` (blocks padded to ceil(m / world) rows).
struct RowPacking {
  struct Bucket {
    std::vector<size_t> mats;
    int64_t chunk = 0;
  };
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;
  std::vector<int64_t> within;
  RowPacking() = default;
  RowPacking(const std::vector<optim::MatDims>& dims, int world, int64_t bucket_elems);
};

struct PrMuonShardedConfig {
  PeriodicRowMuonConfig prm;
  bool reduce_grads = true;
  int64_t bucket_elems = int64_t(1) << 20;  // of the full (gathered) buffers
};

class PrMuonSharded : public Optimizer {
 public:
  PrMuonSharded(std::vector<ParamRef> params, PrMuonShardedConfig cfg, comm::Communicator* comm);
  std::string name() const override { return "prmuon"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;
  bool is_refresh(int64_t t) const { return (t - 1) % cfg_.prm.period == 0; }
  // Momentum elements this rank keeps (for the memory claim).
  int64_t state_elems() const;

 private:
  // All-gathers per-matrix row blocks (src[i] = this rank's rows) into full matrices dst[i].
  void gather_rows(const std::vector<const float*>& src, const std::vector<float*>& dst) const;

  std::vector<ParamRef> params_;
  std::vector<optim::MatDims> dims_;
  std::vector<RowBlock> mine_;
  std::vector<std::vector<float>> momentum_;  // [mine.size(), cols]
  std::vector<float> fit_;                    // row_scale = "fit": each matrix's scale (replicated)
  PrMuonShardedConfig cfg_;
  comm::Communicator* comm_;
  int rank_ = 0, world_ = 1;
  RowPacking rows_;
  OwnerPacking owners_;
};

}  // namespace atl::parallel
