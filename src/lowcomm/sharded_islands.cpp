// Islands whose ranks hold shards of the model (issue 13): tp inside the islands
// (tensor_parallel_islands.cpp) and ZeRO-3 inside the islands. Under ZeRO-3 (Rajbhandari et al.,
// "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020) each rank of an
// island keeps only its own chunks of the flat parameters between steps (the rest is released and
// gathered again for each forward), so the outer step works on those chunks alone: the rank's
// pseudo-gradient is its chunks' (packed), averaged across the islands with the ranks of the same
// place (the island axis: same shard layout, since every island has the same model and ranks),
// applied by the outer optimizer to this rank's slice of the global parameters, and written back
// into its chunks. No all-gather inside the island follows: the next forward gathers the chunks
// anyway, and each rank sent its own chunks rather than a 1/k share of a replicated model, so the
// WAN carries the same bytes as with ddp inside. The outer state is per shard in checkpoints:
// lowcomm.shard.rank<r>.{global,momentum} (r: the rank in the island), lowcomm.tp.rank<t>.* under
// tp, lowcomm.{global,momentum} otherwise; a resume needs the same layout.
// HSDP (replicas of a ZeRO-3 shard group inside the island) sends each chunk once: each replica a
// 1/R share of it, all-gathered over the replicas after (start_average's share). With tp too
// (tp x ZeRO-3 / HSDP) each rank's chunks are of its tp shard. What spans the chunks — the
// replicated parameters agreed over tp, Iso-C's whole matrices — is made whole over the shard
// group by gather_whole(), the pieces put back by scatter_whole(); Streaming's fragments are
// exchanged as the pieces each rank holds of them (held()).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "lowcomm/codec_checkpoint.h"
#include "lowcomm/lowcomm.h"

namespace atl::lowcomm {

void LowComm::attach_shards(std::vector<std::pair<int64_t, int64_t>> owned, const std::string& strategy) {
  owned_ = std::move(owned);
  if (owned_.empty()) return;  // (HSDP over shards of one rank keeps the whole model: as DDP)
  if (strategy == "hsdp") {
    // The island's replicas (dp_replicate) hold the same chunks: each of them sends 1/R of the
    // chunks' pseudo-gradient across and they all-gather the means, as DDP's ranks do with the
    // whole model, so the WAN carries one model per island still.
    share_ = replica_axis_ && replica_axis_->size() > 1 ? replica_axis_ : nullptr;
    zero_shard_ = shard_axis_;
  } else {
    share_ = nullptr;  // every rank sends its own chunks, not a share of a replicated model
    zero_shard_ = tp_ > 1 ? dp_comm_ : island_comm_.get();
  }
}

std::vector<std::pair<int64_t, int64_t>> LowComm::local_ranges() const {
  if (owned_.empty()) return {{0, flat_.numel()}};
  return owned_;
}

Tensor LowComm::local_values() const {
  if (owned_.empty()) return flat_;
  int64_t n = 0;
  for (const auto& [lo, hi] : owned_) n += hi - lo;
  Tensor out = Tensor::empty({n});
  float* o = out.f32();
  for (const auto& [lo, hi] : owned_) o = std::copy(flat_.f32() + lo, flat_.f32() + hi, o);
  return out;
}

void LowComm::set_local_values(const Tensor& v) {
  if (owned_.empty()) {
    if (v.raw() != flat_.raw()) flat_.copy_from(v);
    return;
  }
  const float* i = v.f32();
  for (const auto& [lo, hi] : owned_) {
    std::copy(i, i + (hi - lo), flat_.f32() + lo);
    i += hi - lo;
  }
}

std::vector<LowComm::Piece> LowComm::held(const Ranges& scope) const {
  std::vector<Piece> out;
  for (const auto& [lo, hi] : scope) {
    if (owned_.empty()) {
      out.push_back({lo, lo, hi - lo});
      continue;
    }
    int64_t at = 0;
    for (const auto& [olo, ohi] : owned_) {
      const int64_t a = std::max(lo, olo), b = std::min(hi, ohi);
      if (a < b) out.push_back({a, at + a - olo, b - a});
      at += ohi - olo;
    }
  }
  return out;
}

namespace {
// For each overlap of a piece of `layout` (buffer offsets: the pieces' lengths summed) with a
// range of `want` (offsets in their concatenation): f(buffer offset, whole offset, length).
template <class F>
void overlaps(const std::vector<LowComm::Piece>& layout, const LowComm::Ranges& want, F f) {
  int64_t w = 0;
  for (const auto& [lo, hi] : want) {
    int64_t b = 0;
    for (const LowComm::Piece& p : layout) {
      const int64_t a = std::max(lo, p.flat), e = std::min(hi, p.flat + p.len);
      if (a < e) f(b + a - p.flat, w + a - lo, e - a);
      b += p.len;
    }
    w += hi - lo;
  }
}
}  // namespace

Tensor LowComm::gather_whole(const Tensor& buf, const std::vector<Piece>& layout, const Ranges& want,
                             const std::string& key) {
  int64_t n = 0;
  for (const auto& [lo, hi] : want) n += hi - lo;
  Tensor whole = Tensor::zeros({n});
  const float* b = buf.f32();
  float* w = whole.f32();
  overlaps(layout, want, [&](int64_t bo, int64_t wo, int64_t len) { std::copy_n(b + bo, len, w + wo); });
  if (owned_.empty() || !zero_shard_ || zero_shard_->size() == 1) return whole;
  // The shard group's ranks own disjoint pieces that cover `want`: x + 0 + ... is exact.
  if (std::find(covered_.begin(), covered_.end(), key) == covered_.end()) {
    Tensor cnt = Tensor::zeros({n});
    overlaps(layout, want, [&](int64_t, int64_t wo, int64_t len) { std::fill_n(cnt.f32() + wo, len, 1.f); });
    zero_shard_->all_reduce(cnt, comm::ReduceOp::sum);
    for (int64_t i = 0; i < n; ++i)
      ATOLL_CHECK(cnt.f32()[i] == 1.f, "lowcomm ({}): element {} of the ranges made whole is held by {} ranks of the "
                  "ZeRO-3 shard group, not one", key, i, cnt.f32()[i]);
    covered_.push_back(key);
  }
  zero_shard_->all_reduce(whole, comm::ReduceOp::sum);
  return whole;
}

void LowComm::scatter_whole(const Tensor& whole, Tensor& buf, const std::vector<Piece>& layout,
                            const Ranges& want) const {
  const float* w = whole.f32();
  float* b = buf.f32();
  overlaps(layout, want, [&](int64_t bo, int64_t wo, int64_t len) { std::copy_n(w + wo, len, b + bo); });
}

comm::Communicator* LowComm::outer_state_group() const {
  if (pp_ > 1) return stage_comm_;  // each stage (and tp shard) its own (pipeline_islands.cpp)
  if (!owned_.empty()) return island_comm_.get();
  if (tp_ > 1) return tp_comm_;
  return nullptr;
}

void LowComm::save_outer(std::vector<std::pair<std::string, Tensor>>& extra, nlohmann::json& st) {
  st["tp"] = tp_;
  st["shards"] = owned_.empty() ? 1 : (island_comm_ ? island_comm_->size() : 1);
  st["pp"] = pp_;
  if (pp_ > 1) {  // per stage (pipeline_islands.cpp): the island's pp group gathers it for the writer
    gather_rank_tensors(stage_comm_, {{"global", global_}, {"momentum", mom_}}, tp_ > 1 ? "lowcomm.pptp." : "lowcomm.pp.",
                        extra);
    return;
  }
  if (tp_ == 1 && owned_.empty()) {
    extra.emplace_back("lowcomm.global", global_.clone());
    extra.emplace_back("lowcomm.momentum", mom_.clone());
    return;
  }
  // Every island holds the same outer state: the group of world rank 0 (its tp group, or its
  // island under ZeRO-3) gathers it for the writer; every group gathers alike, only world rank
  // 0's checkpoint is written.
  if (!owned_.empty())
    gather_rank_tensors(island_comm_.get(), {{"global", global_}, {"momentum", mom_}}, "lowcomm.shard.", extra);
  else
    gather_rank_tensors(tp_comm_, {{"global", global_}, {"momentum", mom_}}, "lowcomm.tp.", extra);
}

void LowComm::load_outer(const TensorFile& ours, const nlohmann::json& st, const std::string& what) {
  const int saved = st.value("tp", 1), shards = st.value("shards", 1);
  const int here = owned_.empty() ? 1 : (island_comm_ ? island_comm_->size() : 1);
  const int saved_pp = st.value("pp", 1);
  ATOLL_CHECK(saved_pp == pp_, "{} holds the outer state of islands with parallel.pp = {}; this job has parallel.pp "
              "= {}: the outer parameters and momentum are per stage, resume with parallel.pp = {}", what, saved_pp,
              pp_, saved_pp);
  ATOLL_CHECK(saved == tp_, "{} holds the outer state of islands with parallel.tp = {}; this job has parallel.tp = "
              "{}: the outer parameters and momentum are per tp shard, resume with parallel.tp = {}", what, saved,
              tp_, saved);
  ATOLL_CHECK(shards == here, "{} holds the outer state of islands sharded {} ways by ZeRO-3; this job's islands "
              "keep {} (parallel.strategy, ranks per island): the outer parameters and momentum are per shard, "
              "resume with the saved layout", what, shards, here);
  std::string p = "lowcomm.";
  if (!owned_.empty()) p = fmt::format("lowcomm.shard.rank{}.", island_comm_ ? island_comm_->rank() : 0);
  else if (pp_ > 1)
    p = fmt::format("lowcomm.{}.rank{}.", tp_ > 1 ? "pptp" : "pp", stage_comm_ ? stage_comm_->rank() : 0);
  else if (tp_ > 1) p = fmt::format("lowcomm.tp.rank{}.", tp_comm_ ? tp_comm_->rank() : 0);
  const Tensor& g = ours.get(p + "global");
  ATOLL_CHECK(g.numel() == global_.numel(), "{}: {}global has {} elements, this rank's model {}{}", what, p, g.numel(),
              global_.numel(), pp_ > 1 ? " (its stage: resume with the saved parallel.pp_layers)" : "");
  global_.copy_from(g.reshape(global_.shape()));
  mom_.copy_from(ours.get(p + "momentum").reshape(mom_.shape()));
}

}  // namespace atl::lowcomm
