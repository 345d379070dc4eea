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
//    rank (lowcomm.tp.rank<t>.{global,momentum}), and resume needs the same tp (the model and
//    inner optimizer are saved whole by TensorParallel::full_state, as without islands);
//  * DiLoCo only: Streaming keeps exchanges in flight per fragment and saves them from world rank
//    0's shard alone, and IsoLoCo's Iso-C takes the SVD of whole matrices, which tp splits.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "lowcomm/codec_checkpoint.h"
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

void LowComm::save_outer(std::vector<std::pair<std::string, Tensor>>& extra, nlohmann::json& st) {
  st["tp"] = tp_;
  if (tp_ == 1) {
    extra.emplace_back("lowcomm.global", global_.clone());
    extra.emplace_back("lowcomm.momentum", mom_.clone());
    return;
  }
  // Every island holds the same outer state: the tp group of world rank 0 gathers it for the
  // writer (every tp group gathers alike; only world rank 0's checkpoint is written).
  gather_rank_tensors(tp_comm_, {{"global", global_}, {"momentum", mom_}}, "lowcomm.tp.", extra);
}

void LowComm::load_outer(const TensorFile& ours, const nlohmann::json& st, const std::string& what) {
  const int saved = st.value("tp", 1);
  ATOLL_CHECK(saved == tp_, "{} holds the outer state of islands with parallel.tp = {}; this job has parallel.tp = "
              "{}: the outer parameters and momentum are per tp shard, resume with parallel.tp = {}", what, saved,
              tp_, saved);
  const std::string p = tp_ == 1 ? "lowcomm." : fmt::format("lowcomm.tp.rank{}.", tp_comm_ ? tp_comm_->rank() : 0);
  const Tensor& g = ours.get(p + "global");
  ATOLL_CHECK(g.numel() == global_.numel(), "{}: {}global has {} elements, the model {}", what, p, g.numel(),
              global_.numel());
  global_.copy_from(g.reshape(global_.shape()));
  mom_.copy_from(ours.get(p + "momentum").reshape(mom_.shape()));
}

}  // namespace atl::lowcomm
