// Pipeline parallelism inside the islands (issue 13): DiLoCo (Douillard et al., "DiLoCo:
// Distributed Low-Communication Training of Language Models", 2023) whose islands each run their
// model as a pipeline of stages (parallel/pipeline.h; Huang et al., "GPipe", 2019, and its 1F1B /
// interleaved / zero-bubble schedules). What changes against islands without pp:
//  * a rank holds its stage's parameters only (the pipeline shrinks the model's flat buffers to
//    them before attach), so flat_, the outer parameters and the outer momentum are the stage's:
//    the outer state is per stage by construction, and in checkpoints it is saved per pp rank
//    (lowcomm.pp.rank<r>.{global,momentum}, gathered over the island's pp group; sharded_islands.cpp);
//  * the exchange runs between the ranks of the same stage: across() is the mesh's island axis,
//    the ranks with the same pp (and dp) coordinate in every island, so each stage's ranks average
//    their own stage's pseudo-gradient. The share group that splits it is the stage's dp ranks,
//    not the island (whose other ranks hold other stages and buffers of other sizes);
//  * the tied embedding (a head that reads the lower root): the last stage keeps a copy, which the
//    pipeline's summed gradients keep equal to the first stage's through the inner steps. Across
//    the islands the two copies are averaged by different groups at different offsets of
//    different buffers: a ring over three or more islands sums an element in an order that depends
//    on its offset, and a codec's blocks and scales fall elsewhere, so the copies would part.
//    agree_over_pp() gives the last stage the first stage's averaged pseudo-gradient of them (a
//    broadcast over the island's pp group, one embedding per sync over the fast links);
//  * checkpoints: the pipeline is built over the island's communicator, so its full_state()
//    gathers the island's whole model on the island's rank 0, and save_state's gathers of the
//    other islands' models work as without pp.
//  * IsoLoCo: a stage holds its matrices whole (stages cut between blocks), so each stage's ranks
//    Iso-C-merge their own stage's matrices after the average, as one process merges them all;
//    the tied embedding (merge_scope = "all") is merged on both stages from the same agreed
//    pseudo-gradient (agree_over_pp runs first), so its copies stay equal.
//  * Streaming DiLoCo: the fragments are cut over the whole model's blocks by their index (block b
//    in fragment b mod P, as without pp), so a stage holds the blocks of each fragment it has and
//    the parts outside the blocks go with fragment 0 on whichever stage holds them (the first's
//    embeddings, the last's final norm and tied copy). A stage may hold none of a fragment: its
//    exchange is then empty on that stage's ranks in every island alike. Every stage keeps the
//    same schedule, so fragment 0's tied copy is agreed over pp in the same step on all stages;
//    the pending exchanges are saved per pp rank (outer_state_group() is the pp group).
//  * tp x pp (session 13): a rank holds its tp shard of its stage. Nothing new in the exchange
//    (the ranks of one (stage, tp) coordinate average their own piece, as under tp alone); the
//    replicated parameters agreed over tp are the stage's (lowcomm.cpp keeps those inside the
//    flat buffers); the tied copies are agreed over pp per tp shard (the pp axis joins ranks of
//    one tp coordinate, which hold the same vocabulary rows); the outer state and Streaming's
//    pending exchanges are per (stage, tp) rank: the island's pp x tp group gathers them
//    (lowcomm.pptp.rank<r>.*, r its rank there).
//  * cp x pp (session 13): a stage's cp ranks hold it whole and share its exchange as its dp ranks
//    do (data_parallel_comm is dp x cp), as cp inside islands without pp; nothing else changes.
//    IsoLoCo under pp x tp: the stage's tp group gathers its split matrices whole (isoloco.cpp),
//    over the stage's matrices only, as without tp.
// Refused before step 1, naming the keys:
// ZeRO-3 / HSDP inside pipelined islands (their stage shards would need per-shard outer state).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "lowcomm/lowcomm.h"
#include "parallel/pipeline.h"

namespace atl::lowcomm {

void LowComm::setup_pipeline(parallel::Mesh& mesh) {
  const parallel::MeshShape& m = mesh.shape();
  pp_ = int(m.pp);
  if (pp_ == 1) return;
  ATOLL_CHECK(c_.method == "diloco" || c_.method == "isoloco" || c_.method == "streaming",
              "lowcomm.method = '{}' with parallel.pp = {} inside the islands: diloco, isoloco and streaming run "
              "with pp", c_.method, pp_);
  if (!world_) return;
  pp_comm_ = mesh.axis("pp");
  // The island's model-parallel block: under tp each (stage, tp shard) holds its own piece.
  stage_comm_ = m.tp > 1 ? mesh.group({"pp", "tp"}) : pp_comm_;
  // The stage's data-parallel ranks hold the same parameters: they split the stage's exchange.
  share_ = parallel::data_parallel_comm(mesh);
}

void LowComm::attach_pipeline(const std::string& strategy) {
  if (pp_ == 1) return;
  ATOLL_CHECK(pipe_, "lowcomm: parallel.pp = {} inside the islands, but no pipeline was attached", pp_);
  // ZeRO-1/2 shard only the inner optimizer's state: every rank still holds its stage's parameters
  // whole, which is all the exchange and the outer state see.
  ATOLL_CHECK(strategy == "ddp" || strategy == "zero1" || strategy == "zero2",
              "parallel.strategy = '{}' with parallel.pp = {} inside the islands: a pipelined island's stages hold "
              "their parameters whole (ddp, zero1 or zero2); zero3 and hsdp inside pipelined islands are not "
              "composed (their stage shards would need per-shard outer state)", strategy, pp_);
  const int r = pp_comm_ ? pp_comm_->rank() : 0;
  const float* base = flat_.f32();
  if (r == 0 || r == pp_ - 1)
    for (nn::Parameter* q : pipe_->tied()) {
      const float* v = q->value.f32();
      ATOLL_CHECK(v >= base && v + q->value.numel() <= base + flat_.numel(),
                  "lowcomm: the tied {} is not in pp rank {}'s flat parameters", q->name, r);
      tied_.emplace_back(v - base, v - base + q->value.numel());
    }
  // Every stage's size, for the job's bytes on the wire (the stages send different amounts).
  stage_numel_ = numel_per_stage(flat_.numel());
}

std::vector<int64_t> LowComm::numel_per_stage(int64_t n) const {
  if (!stage_comm_) return {n};
  const int k = stage_comm_->size();  // pp, or pp x tp: every piece of one pipeline
  Tensor mine = Tensor::empty({2}), all = Tensor::empty({2 * int64_t(k)});
  mine.f32()[0] = float(n >> 24);  // two exact halves: f32 holds integers below 2^24
  mine.f32()[1] = float(n & ((int64_t(1) << 24) - 1));
  stage_comm_->all_gather(mine, all);
  std::vector<int64_t> out;
  for (int s = 0; s < k; ++s) out.push_back((int64_t(all.f32()[2 * s]) << 24) + int64_t(all.f32()[2 * s + 1]));
  return out;
}

void LowComm::agree_over_pp(Tensor& delta, const std::vector<Piece>* pieces) {
  if (!pp_comm_ || !pipe_ || pipe_->tied().empty()) return;
  int64_t n = 0;
  for (nn::Parameter* q : pipe_->tied()) {
    int64_t k = 1;
    for (int64_t d : q->shape) k *= d;
    n += k;
  }
  Tensor buf = Tensor::empty({n});
  const int r = pp_comm_->rank();
  // Where a tied flat range lies in delta: at itself, or inside the piece of `pieces` holding it.
  auto at = [&](int64_t lo, int64_t hi) -> float* {
    if (!pieces) return delta.f32() + lo;
    int64_t pos = 0;
    for (const Piece& q : *pieces) {
      if (lo >= q.flat && hi <= q.flat + q.len) return delta.f32() + pos + (lo - q.flat);
      pos += q.len;
    }
    fail("lowcomm: the tied flat range [{}, {}) is not in this fragment's buffer on pp rank {}", lo, hi, r);
  };
  float* b = buf.f32();
  if (r == 0)
    for (const auto& [lo, hi] : tied_) b = std::copy(at(lo, hi), at(lo, hi) + (hi - lo), b);
  pp_comm_->broadcast(buf, 0);
  if (r != pp_ - 1) return;
  const float* i = buf.f32();
  for (const auto& [lo, hi] : tied_) {
    std::copy(i, i + (hi - lo), at(lo, hi));
    i += hi - lo;
  }
}

}  // namespace atl::lowcomm
