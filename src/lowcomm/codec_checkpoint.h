// The error feedback of compressed gradient exchanges in checkpoints (issue 13): DDP's and
// ZeRO-1/2's [parallel] codec (comm/compressed_allreduce.h) keep, per bucket and rank, the part of
// the gradient each encode left unsent (and, for an all-reduce, the owner's re-encode residual)
// plus the call counter that seeds stochastic rounding. Without them a resumed run with a lossy
// codec sends different bits from its first step on. They are saved as optimizer entries
// `parallel.codec.rank<r>.<bucket>.{meta,residual,residual2,gift}` (r: the world rank; every
// rank's all-gathered for the writer) with `state.gradient_codec` saying by what.
//
// Resume with the same ranks: each rank takes its own, bit-exact. With another data-parallel
// size (the same islands and tp before and after; each island's, and each tp coordinate's,
// data-parallel ranks reduce with a codec of their own, so each such group's residuals go to the
// group in its place, which holds the same buckets: its tp shard's): where every bucket keeps its
// size (DDP's buckets do not depend on the ranks) the residuals are remapped — a group's local
// residuals summed onto its rank 0 (the exchange sums the ranks' encodes, so the total unsent
// gradient is kept), the owners' re-encode residuals cut into the new owners' chunks — which
// changes no gradient's total but is not bit-exact (nothing on other ranks is).
// Buckets whose size changes (ZeRO rounds each bucket to a multiple of the ranks) are refused by
// name. A checkpoint with another codec setting, or none, starts the error feedback at zero (a
// warning).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "parallel/data_parallel.h"
#include "tensor/tensor.h"

namespace atl::lowcomm {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Collective over world (null or one rank: mine under rank 0): every rank's `mine` goes to world
// rank 0 as "<prefix>rank<r>.<name>", appended to out there. Every rank must hold the same
// names in the same order; sizes may differ by rank (each tensor travels padded to the longest).
void gather_rank_tensors(comm::Communicator* world, const NamedTensors& mine, const std::string& prefix,
                         NamedTensors& out);

// Collective over world, after everything else has added its entries to opt_sd (lowcomm's
// island gathers walk opt_sd): adds the gradient codec's state of every rank.
void save_gradient_codec(parallel::DataParallel& dp, comm::Communicator* world, NamedTensors& opt_sd,
                         nlohmann::json& state);
// Before anything else reads opt_sd: takes the parallel.codec.* entries out and loads this
// rank's (or the remapped) state into dp's codec. what: the checkpoint, for messages.
void load_gradient_codec(parallel::DataParallel& dp, comm::Communicator* world, NamedTensors& opt_sd,
                         const nlohmann::json& state, const std::string& what);

// The remap itself (for the test): the saved state `ours` (parallel.codec.rank<r>.* entries) of
// one data-parallel group, whose old world ranks `old_ranks` are listed in their group order,
// for rank `me` of the new group of Wn ranks, whose codec keeps `tensors` (key, elements).
NamedTensors remap_codec_state(const NamedTensors& ours, const std::vector<int>& old_ranks,
                               const std::vector<std::pair<std::string, int64_t>>& tensors, int me, int Wn,
                               const std::string& what);

}  // namespace atl::lowcomm
