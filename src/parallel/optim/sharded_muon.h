// The Muon family on a ZeRO/FSDP-sharded model: Muon (Jordan et al., 2024) with DMuon-style
// ownership (one owner rank orthogonalizes each matrix; "Muon is scalable for LLM training", Liu et
// al., 2025, for the distributed form) and Periodic Row-wise Muon ("Scaling Muon for Diffusion
// Transformers"), over the equal flat chunks that ZeRO (Rajbhandari et al., SC 2020) gives each
// rank. A chunk cuts matrices at arbitrary elements, so a rank holds *pieces* of matrices.
//
// Per step, on the sharding group (under HSDP the shard group; the replicas compute the same):
//  - everything that is not a hidden matrix (optim's classify_param: embeddings, head, gains,
//    biases) is AdamW on its pieces (ShardedAdamW), elementwise and exact;
//  - Muon: the momentum and the Nesterov update are elementwise on the pieces. One all_to_all
//    sends every piece of the update to its matrix's owner (owners by longest-processing-time-
//    first on ns_flops, as muon_owner.h), the owner assembles and orthogonalizes the whole
//    matrix, and a second all_to_all returns to every rank its pieces of the result, which it
//    applies to its parameter shard. ZeRO's usual all-gather (stage 1/2) or release (stage 3) of
//    the parameters follows. Both exchanges move at most this rank's hidden-matrix shard each way;
//    the all_to_all's chunks are padded to the largest holder-to-owner volume (padding_fraction()).
//  - Periodic Row-wise Muon, refresh steps (1, K+1, ...): the owner path above. Other steps
//    normalize slices (rows, or columns with axis = "cols") of the Nesterov momentum. A shard
//    boundary may cut a slice, so each rank computes per-slice partial sums of squares (double)
//    over its pieces and ONE all_gather of them (#slices doubles per rank: m, or n, per matrix;
//    16k for GPT-2 d=384/L=6, 129 KB per rank) lets every rank add them in rank order; nothing
//    else is exchanged on those steps. (An all_reduce would move 1/world of that, but in float,
//    and a float sum perturbs the norm's last bits and so the update's.)
//    With row_scale = "fit" the owner also fits the row step's scale at each refresh from the
//    whole matrices it holds, and one all_reduce of #matrices floats shares the scales.
// The matrices equal single-rank Muon / PeriodicRowMuon's: the owner orthogonalizes exactly the
// matrix a single rank would (assembled bit for bit); a cut slice's norm differs only by the
// order of its double sum.
//
// Under tensor parallelism (tp non-null, docs/tensor_parallel.md "Session 11") the layout is
// this rank's tp shard, so a matrix assembled over the shard group is a tp block of it. Each
// owner then gathers the block's Nesterov update over the tp group (TensorParallel::gather, the
// plan's split rule), orthogonalizes the whole matrix and keeps its block: exactly one rank's
// update of the whole matrix. Owners are chosen from the whole matrices' costs, so the tp ranks of
// one dp coordinate own the same matrices and their gathers pair up in matrix order. The update
// scale and PRMuon's gain use the whole shape; a slice (row or column) that tp cuts has its
// partial sums of squares added over tp as well, in tp rank order. Only the update is gathered:
// the momentum stays this rank's pieces of its tp block (1/(tp * dp) of the whole).
//
// State is this rank's pieces of the momentum (and AdamW's moments), saved and loaded under the
// names of the single-rank GroupedOptimizer that make_optimizer builds for the same config:
// "step", "<type>.step", "<type>.<param>.momentum", "adamw.step", "adamw.<param>.exp_avg", ...
#pragma once
#include "optim/periodic_row_muon.h"
#include "parallel/tensor_parallel.h"
#include "parallel/optim/sharded_adamw.h"

namespace atl::parallel {

struct ShardedMuonConfig {
  std::string type = "muon";  // "muon" | "prmuon"
  PeriodicRowMuonConfig prm;  // prm.muon: Muon's hyperparameters; period and axis: prmuon only
  AdamWConfig adamw;          // for everything that is not a hidden matrix
};

class ShardedMuon final : public ShardedOptimizer {
 public:
  // group: the communicator the layout's buckets are sharded over (null: one rank). tp: the
  // model's tensor parallelism (null or one rank: none), whose split matrices are updated whole.
  ShardedMuon(nn::Model& model, const FlatLayout& layout, comm::Communicator* group, ShardedMuonConfig cfg,
              const TensorParallel* tp = nullptr);
  std::string name() const override { return "adamw+" + cfg_.type; }
  void step(const StepContext& ctx) override;
  // The full state with a prefix (collective), as GroupedOptimizer would save it.
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;
  void save_full_state(std::vector<std::pair<std::string, Tensor>>& out, comm::Communicator* group) const override;
  void load_full_state(const TensorFile& f) override;

  // Momentum elements this rank keeps (its pieces only).
  int64_t momentum_elems() const { return int64_t(momentum_.size()); }
  // Padding in the all_to_all buffers: (world * chunk - hidden elements) / (world * chunk).
  double padding_fraction() const;
  // The owner rank of each hidden matrix, in parameter order.
  std::vector<int> owners() const;
  // Where the step's time goes on this rank (seconds summed over `steps`): what Muon's cost on
  // a CPU is made of, and how much of it the two exchanges add. The orthogonalization includes
  // waiting for the slowest owner.
  struct Timing {
    double total_s = 0, adamw_s = 0, exchange_s = 0, orthogonalize_s = 0;
    int64_t steps = 0;
  };
  const Timing& timing() const { return timing_; }
  void reset_timing() { timing_ = {}; }

 private:
  struct Mat {
    int param;
    int64_t lo, rows, cols;  // flat offset and matrix view (this rank's tp block under tp)
    int64_t full_rows, full_cols;  // the whole matrix's (rows, cols unless tp splits it)
    bool split = false;      // tp splits it: the owner gathers the whole update over tp
    bool cross = false;      // PRMuon's slices run across tp's split: their sums are added over tp
    int owner;
    float scale;             // Muon's update scale
    int64_t slice0 = 0;      // offset of its slices in the norm buffer (PRMuon)
    int64_t state0 = 0;      // offset in the gathered full-state buffer
  };
  struct Piece {
    size_t mat;
    Span flat;
    int64_t state = 0;  // offset in momentum_ (own pieces)
    int64_t a2a = 0;    // offset within the holder->owner chunk of the all_to_all buffers
  };
  bool refresh_step() const;
  // PRMuon with row_scale = "fit": the non-refresh gain is fitted at each refresh.
  bool fitted() const { return cfg_.type == "prmuon" && cfg_.prm.fit_scale; }
  // u (this rank's pieces, back to back) -> the orthogonalized update's pieces, via the owners.
  void orthogonalize_by_owners(std::vector<float>& u);
  // u -> each slice normalized over the whole matrix (one all_reduce of partial sums).
  void normalize_slices_sharded(std::vector<float>& u);
  // Under tp: matrix k's tp block u of the update -> o, this block of the whole matrix's
  // orthogonalization (gathered over tp); fit (non-null: PRMuon's fit) from the whole matrices.
  void orthogonalize_whole(size_t k, const float* u, float* o, float* fit);
  // Under tp: the slices' sums of squares that tp cuts (Mat::cross) added over the tp group.
  void add_cut_slices_over_tp(std::vector<double>& tot);

  nn::Model& model_;
  comm::Communicator* group_;
  const TensorParallel* tp_ = nullptr;  // set only when tp > 1
  int rank_ = 0, world_ = 1;
  ShardedMuonConfig cfg_;
  std::vector<Mat> mats_;
  std::vector<Piece> mine_;
  std::vector<std::pair<int, Piece>> incoming_;  // (holder rank, piece) of matrices this rank owns
  int64_t chunk_ = 1, nslices_ = 0, hidden_numel_ = 0, max_owned_ = 0;
  std::vector<float> momentum_;
  std::vector<float> fit_;  // per matrix: the fitted row scale of the last refresh (replicated)
  int64_t mat_steps_ = 0;  // the matrix group's own counter ("<type>.step")
  Timing timing_;
  std::unique_ptr<ShardedAdamW> rest_;
};

}  // namespace atl::parallel
