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
//  * DiLoCo only: Streaming keeps exchanges in flight per fragment and saves them from world rank
//    0's shard alone, and IsoLoCo's Iso-C takes the SVD of whole matrices, which tp splits.
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
  ATOLL_CHECK(c_.method == "diloco", "parallel.tp = {} inside islands runs lowcomm.method = 'diloco' only, not '{}': "
              "streaming keeps its fragments' exchanges in flight per shard and isoloco merges whole matrices "
              "(Iso-C's SVD), which tp splits", tp_, c_.method);
  if (!world_) return;
  tp_comm_ = mesh.axis("tp");
  share_ = parallel::data_parallel_comm(mesh);  // the island's dp ranks of this tp coordinate
}

void LowComm::agree_over_tp(Tensor& delta) {
  if (!tp_comm_ || tp_comm_->size() == 1 || replicated_.empty()) return;
  int64_t n = 0;
  for (const auto& [lo, hi] : replicated_) n += hi - lo;
  Tensor buf = Tensor::empty({n});
  float* b = buf.f32();
  for (const auto& [lo, hi] : replicated_) b = std::copy(delta.f32() + lo, delta.f32() + hi, b);
  tp_comm_->broadcast(buf, 0);
  b = buf.f32();
  for (const auto& [lo, hi] : replicated_) {
    std::copy(b, b + (hi - lo), delta.f32() + lo);
    b += hi - lo;
  }
}

}  // namespace atl::lowcomm
