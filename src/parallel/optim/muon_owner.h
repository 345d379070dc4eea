// DMuon-style distributed Muon ("DMuon": each hidden matrix has one owner rank that alone runs its
// Newton-Schulz orthogonalization; Jordan et al.'s Muon for the update rule itself). Owners are
// assigned by longest-processing-time-first on the Newton-Schulz cost of each matrix (ns_flops),
// so the ranks' orthogonalization work is balanced to within the largest matrix.
//
// Two modes:
//  - replicated (reduce_grads = false): gradients arrive already averaged on every rank (DDP).
//    Every rank keeps the full momentum of every matrix (elementwise, cheap); only the owner
//    orthogonalizes.
//  - owner-reduced (reduce_grads = true): gradients arrive as each rank's local, unreduced
//    gradient; one reduce-scatter (avg) of an owner-packed buffer delivers each matrix's averaged
//    gradient to its owner only, which alone keeps that matrix's momentum (ZeRO-1/2-style state
//    sharding by matrix). The data-parallel layer must then skip its own gradient all-reduce.
//
// In both modes the orthogonalized updates are shared with ONE all_gather of a buffer in which
// chunk r holds rank r's updates back to back (padded to the largest chunk), rather than one
// broadcast per matrix: each rank sends its updates once, the collective count per step is 1
// instead of #matrices (24 for GPT-2 d=384/L=6, each paying a latency), and the cost of the padding
// (max load - mean load, reported by padding_fraction()) is small once the LPT balance holds.
// Every rank then applies every update, so parameters stay replicated and bit-identical to
// single-rank Muon's.
//
// State is saved exactly as Muon's (prefix + "step", prefix + param + ".momentum", full shapes),
// so checkpoints move between world sizes and between Muon and MuonOwner. In owner-reduced mode
// save_state is collective (every rank must call it; the momenta are all-gathered).
#pragma once
#include "comm/communicator.h"
#include "optim/muon.h"

namespace atl::parallel {

// Longest processing time first: items sorted by decreasing cost (ties by index), each given to
// the currently least loaded rank (ties to the lowest rank). Returns the owner of each item.
std::vector<int> assign_owners_lpt(const std::vector<double>& cost, int world);

// Packs per-matrix buffers owner by owner: chunk r of a world * chunk() buffer holds the matrices
// owned by r in parameter order. Shared by the distributed Muon-family optimizers.
struct OwnerPacking {
  std::vector<int> owner;
  std::vector<int64_t> offset;  // of each matrix in the packed buffer (owner * chunk + within)
  std::vector<int64_t> load;    // elements per rank
  int64_t chunk = 0;            // max load (at least 1, so collectives never see empty tensors)
  OwnerPacking() = default;
  OwnerPacking(const std::vector<int64_t>& numel, std::vector<int> owners, int world);
  // (chunk * world - sum of loads) / (chunk * world).
  double padding_fraction() const;
};

struct MuonOwnerConfig {
  MuonConfig muon;
  bool reduce_grads = false;
};

class MuonOwner : public Optimizer {
 public:
  // comm may be null (one process).
  MuonOwner(std::vector<ParamRef> params, MuonOwnerConfig cfg, comm::Communicator* comm);
  std::string name() const override { return "muon"; }
  void step(const StepContext& ctx) override;
  void save_state(std::vector<std::pair<std::string, Tensor>>& out, const std::string& prefix) const override;
  void load_state(const TensorFile& f, const std::string& prefix) override;
  const OwnerPacking& packing() const { return pack_; }
  bool owns(size_t i) const { return pack_.owner[i] == rank_; }

 private:
  std::vector<ParamRef> params_;
  std::vector<Tensor> momentum_;  // undefined (empty) for matrices this rank does not keep
  MuonOwnerConfig cfg_;
  comm::Communicator* comm_;
  int rank_ = 0, world_ = 1;
  OwnerPacking pack_;
  Tensor send_, recv_;  // [chunk], [world * chunk]
  Tensor grads_;        // owner-reduced mode: [world * chunk] packed local gradients
};

}  // namespace atl::parallel
