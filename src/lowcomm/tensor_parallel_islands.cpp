// Tensor parallelism inside the islands (issue 13): each island is a dp x tp block of ranks
// (parallel/tensor_parallel.h inside it), and the outer exchange runs between the ranks with the
// same tp (and dp) coordinate in every island — the mesh's island axis — each averaging its own
// shard's pseudo-gradient. Not through island leaders: the tp shards are disjoint, so the mean of
// a shard is the shard of the mean and nothing has to be gathered into one rank first (a
// leader would carry the whole model over one link and add a gather and a scatter inside the
// island per sync); the WAN carries the same bytes, one model per island, spread over the tp
// ranks' links. What needs care:
//  * parameters every tp rank holds whole (norms, the row-parallel biases) sit at other offsets in
//    each shard's flat buffer, so an fp32 ring all-reduce over three or more islands may sum them
//    in another order per tp rank: agree_over_tp() gives them tp rank 0's mean;
//  * the outer state (global parameters, momentum) is per shard: checkpoints hold it per tp
//    rank (lowcomm.tp.rank<t>.{global,momentum}; sharded_islands.cpp), and resume needs the same
//    tp (the model and inner optimizer are saved whole by TensorParallel::full_state, as without
//    islands);
//  * under ZeRO-3 as well (tp x ZeRO-3 inside the islands) each rank holds its chunks of the
//    shard (sharded_islands.cpp), which cut the replicated parameters at places that differ by tp
//    rank: agree_over_tp() sums the island's dp ranks' pieces into the whole before tp rank 0's
//    are broadcast;
//  * Streaming DiLoCo's fragments are the shard's blocks (the same on every tp rank): each rank
//    exchanges its shard of a fragment, and the exchanges in flight are saved per tp rank;
//  * IsoLoCo's Iso-C takes the SVD of whole matrices, which tp splits: the tp group gathers each
//    split matrix of the averaged pseudo-gradient whole (the same bits on every tp rank), every
//    tp rank merges it alike, and each keeps its own piece (isoloco.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "lowcomm/lowcomm.h"
#include "parallel/tensor_parallel.h"

namespace atl::lowcomm {

void LowComm::setup_tensor_parallel(parallel::Mesh& mesh) {
  tp_ = int(mesh.shape().tp);
  share_ = island_comm_.get();
  if (tp_ == 1) return;
  if (!world_) return;
  tp_comm_ = mesh.axis("tp");
  share_ = parallel::data_parallel_comm(mesh);  // the island's dp ranks of this tp coordinate
  dp_comm_ = share_;
}

void LowComm::agree_over_tp(Tensor& delta, const Ranges& scope, const std::string& key) {
  if (!tp_comm_ || tp_comm_->size() == 1 || replicated_.empty() || scope.empty()) return;
  // The replicated parameters inside the scope, whole: the same list on every tp rank (the same
  // parameters, shapes and order). Under ZeRO-3 this rank holds pieces of them cut at places
  // that differ by tp rank when the tp split is uneven (tensor_parallel_fsdp.cpp), so they are
  // made whole over the shard group first.
  Ranges want;
  for (const auto& [lo, hi] : replicated_)
    for (const auto& [slo, shi] : scope)
      if (lo < shi && slo < hi) {
        want.emplace_back(lo, hi);
        break;
      }
  if (want.empty()) return;
  const std::vector<Piece> layout = held(scope);
  Tensor buf = gather_whole(delta, layout, want, "tp." + key);
  tp_comm_->broadcast(buf, 0);
  scatter_whole(buf, delta, layout, want);
}

}  // namespace atl::lowcomm
