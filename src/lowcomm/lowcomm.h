// Training across islands: groups of ranks with fast links inside (the mesh's `island` axis,
// [parallel] islands = M), joined by a slow wide-area network. Inside an island the usual data
// parallelism runs over the island's sub-communicator (island_comm()); every so often the
// islands exchange pseudo-gradients over across() (the ranks with the same place in each island)
// and an outer optimizer merges them. The trainer calls after_step() after each optimizer step.
//
// Methods, registered by name ([lowcomm] method): diloco (diloco.h), streaming
// (streaming_diloco.cpp), isoloco (isoloco.cpp). Keys of [lowcomm] (ranges checked, unknown keys
// refused by the config): method, inner_steps (H), outer_lr, outer_momentum, nesterov, exchange,
// and the methods' own (fragments, overlap_steps, mixing; merge).
//
// Traffic: the ranks of an island hold the same parameters (DDP, ZeRO-1/2), so each sends only
// its 1/k share of the pseudo-gradient across (k ranks per island) and the island all-gathers the
// averaged shares over its fast links: the WAN carries one model's worth per island and sync.
// Ranks that hold shards (tp inside the islands, ZeRO-3) exchange their own shard's instead
// (tensor_parallel_islands.cpp, sharded_islands.cpp). cp ranks hold the whole model (they split
// the sequence), so they share the exchange as data-parallel ones do. Under pp inside the
// islands each rank holds its stage's parameters only: the outer state is per stage, the ranks of
// one stage exchange across the islands, the tied embedding's copies are kept equal
// (pipeline_islands.cpp).
//
// Checkpoints (save_state/load_state): the outer state (global parameters, momentum, exchanges
// in flight), every island's own parameters and inner optimizer state, and every rank's
// exchange state (a codec's error-feedback residuals), so a run stopped between outer steps
// resumes bit-exact.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/registry.h"
#include "lowcomm/exchange.h"
#include "lowcomm/sync_controller.h"
#include "nn/model.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/tensor_parallel.h"

namespace atl::parallel {
class PipelineParallel;
}

namespace atl::lowcomm {

struct LowCommConfig {
  std::string method = "diloco";
  int64_t inner_steps = 50;  // H
  double outer_lr = 0.7, outer_momentum = 0.9;
  bool nesterov = true;
  std::string exchange = "fp32";
  comm::CodecSpec codec;  // the exchange's codec settings (exchange.h: exchange_spec)
  // Streaming DiLoCo: fragments P, overlap tau (inner steps between starting an exchange and
  // applying it), mixing alpha (the weight of the local parameters when merging).
  int64_t fragments = 4, overlap_steps = 1;
  double mixing = 0.5;
  // IsoLoCo: "iso_c" or "average" (the ablation: plain averaging).
  std::string merge = "iso_c";
  std::string merge_scope = "hidden";  // which matrices Iso-C merges: "hidden" or "all" 2-D ones
  // [fault] island_drop_at_sync = n: the last island stops answering at its n-th exchange (for
  // the test that the others fail with a message instead of hanging); 0: never.
  int64_t drop_at_sync = 0;
  // When to sync (sync_controller.h): [lowcomm] sync_policy and its sync_* keys.
  SyncPolicyConfig sync;
  // Reads [lowcomm]; null when islands = 1 and no method is named.
  static std::unique_ptr<LowCommConfig> from_config(Config& cfg, int64_t islands);
};

// Nesterov SGD as torch.optim.SGD (dampening 0) on the global parameters, the averaged
// pseudo-gradient d as the gradient: b = mu b + d; u = nesterov ? d + mu b : b; x -= lr u.
void outer_sgd(float* x, float* b, const float* d, int64_t n, const LowCommConfig& c);

class LowComm {
 public:
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  // A part of flat_ this rank holds: its offset in flat_, its offset in local_values()'s packing
  // (global_, mom_), its length.
  struct Piece {
    int64_t flat, at, len;
  };
  LowComm(const LowCommConfig& c, parallel::Mesh& mesh, comm::Communicator* world, Config& cfg);
  virtual ~LowComm();
  virtual std::string describe() const = 0;
  const LowCommConfig& config() const { return c_; }
  int island() const { return island_; }
  int islands() const { return islands_; }
  // The island's own ranks (data parallelism runs over it); null for one process.
  comm::Communicator* island_comm() const { return island_comm_.get(); }
  // The ranks with this rank's place in every island (ordered by island); null for one process.
  comm::Communicator* across() const { return across_; }

  // Once the data-parallel strategy exists: starts every island from island 0's parameters, takes
  // the outer state.
  // tp: the tensor-parallel context of this rank's shard (tp inside the islands; null without),
  // for the parameters every tp rank holds whole (tensor_parallel_islands.cpp).
  // owned: the flat ranges of the values this rank keeps (DataParallel::value_ranges; ZeRO-3's
  // shards, sharded_islands.cpp); empty: the whole model.
  void attach(nn::Model& model, const std::string& strategy, const parallel::TensorParallel* tp = nullptr,
              std::vector<std::pair<int64_t, int64_t>> owned = {});
  // pp inside the islands (pipeline_islands.cpp): the pipeline whose stage this rank trains; before
  // attach(), whose model is then the stage's (its flat buffers hold the stage's parameters).
  void set_pipeline(const parallel::PipelineParallel* pipe) { pipe_ = pipe; }
  // After the optimizer step of `step` (0-based). Returns the metrics of the syncs it finished
  // (null when none): bytes sent, sync time, compute utilization.
  nlohmann::json after_step(int64_t step);
  // Whether the islands agree on something this step (the trainer's stop decision): the end of
  // an outer round, when every island waits for the others anyway.
  bool round_end(int64_t step) const { return due_step_ == step; }
  // The communicator for the trainer's per-step phase guard (resilience/phase_guard.h) before
  // `step`: the world at a run's first step and at the first step of each outer round, the
  // island's own ranks otherwise. Over the world every step, its 24-byte all-gather crossed the
  // WAN each inner step: 3 round trips, and 11 KB per step on the veth counters for 4 islands with
  // the store heartbeats its progress notes set off (0.57 MB per outer step at H = 50, more than
  // int8's whole exchange gained; docs/islands.md). The eval, sample and checkpoint checks stay
  // on the world; a desync across islands is caught at the next round's start.
  comm::Communicator* guard_comm(int64_t step);
  // The mean of x over every rank of the job (collective over the world).
  double world_average(double x);

  // Collective over the world, after the strategy's full_state(): adds the outer state and the
  // other islands' states (as lowcomm.* optimizer entries) and a description to `state`.
  void save_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                  std::vector<std::pair<std::string, Tensor>>& opt_sd, nlohmann::json& state);
  // Before the strategy's load_full_state(): takes this island's entries (and the outer state)
  // out of a checkpoint; one saved without islands starts the outer state from its parameters.
  void load_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                  std::vector<std::pair<std::string, Tensor>>& opt_sd, const nlohmann::json& state,
                  const std::string& what);
  // After the strategy's load_full_state(): a checkpoint without outer state starts it here.
  void finish_load();

 protected:
  // Whether the sync policy asked for a sync after `step` (decided once, in after_step).
  bool sync_due(int64_t step) const { return due_step_ == step; }
  // Method hooks. sync(): the method's work after step (metrics for what finished, or null).
  virtual nlohmann::json sync(int64_t step) = 0;
  virtual void save_method(std::vector<std::pair<std::string, Tensor>>& out, nlohmann::json& st) = 0;
  virtual void load_method(const TensorFile& f, const nlohmann::json& st, const std::string& what) = 0;
  virtual void on_attach() {}

  // Averages buf (contiguous f32) in place over the islands, each rank sending its 1/k share;
  // returns what completes it (then buf holds the mean on every rank).
  // key names buf for the exchange's error feedback (the same tensor each round).
  // mats: the whole matrices inside buf (for GIFT), e.g. matrices_within().
  std::function<void()> start_average(const Tensor& buf, const std::string& key,
                                      const std::vector<comm::MatrixSpan>& mats = {});
  // Whether p's values are in this rank's flat buffer (under pp the other stages' parameters are
  // unbound here, or after sync_full_model allocated elsewhere).
  bool in_flat(const nn::Parameter* p) const {
    return p->value.defined() && p->value.f32() >= flat_.f32() && p->value.f32() < flat_.f32() + flat_.numel();
  }
  // The model's 2-D parameters that lie wholly inside the concatenation of the flat ranges
  // [lo, hi) (in order), as spans of that concatenation.
  std::vector<comm::MatrixSpan> matrices_within(const std::vector<std::pair<int64_t, int64_t>>& ranges) const;
  int64_t wan_bytes(int64_t numel) const;
  // The parts of the flat ranges `scope` (whole parameters, ascending) this rank holds, in scope
  // order, each cut by the owned ranges (ZeRO-3) in their order; a buffer "laid out as" them is
  // their values concatenated (local_values() is laid out as held({{0, flat_.numel()}})).
  std::vector<Piece> held(const Ranges& scope) const;
  // The flat ranges `want` (concatenated) whole on every rank, from buf laid out as `layout`:
  // under ZeRO-3 / HSDP the shard group's ranks' pieces summed (they partition each range; a
  // count checks it once per key); without it the pieces are all here. And the reverse: this
  // rank's pieces of `whole` back into buf.
  Tensor gather_whole(const Tensor& buf, const std::vector<Piece>& layout, const Ranges& want, const std::string& key);
  void scatter_whole(const Tensor& whole, Tensor& buf, const std::vector<Piece>& layout, const Ranges& want) const;
  // tp inside the islands (tensor_parallel_islands.cpp): the averaged pseudo-gradient of the
  // parameters every tp rank holds whole made the same bits on all of them (tp rank 0's), so
  // that the outer step keeps them equal whatever order the exchange summed them in. delta is
  // laid out as held(scope); scope: the whole model (DiLoCo), a fragment (streaming; empty where
  // the rank's stage holds none of it, which agrees nothing).
  void agree_over_tp(Tensor& delta, const Ranges& scope, const std::string& key);
  // pp inside the islands (pipeline_islands.cpp): the tied embedding's averaged pseudo-gradient
  // on the last stage made the first stage's bits, so the two copies step alike whatever the
  // exchange did to them. delta is laid out as flat_ (ddp inside: each rank holds its stage whole),
  // or as `pieces` of it (a streaming fragment's buffer: the tied ranges are in fragment 0 on both
  // stages, and every stage calls it for that fragment alike: it is a collective over pp).
  void agree_over_pp(Tensor& delta, const std::vector<Piece>* pieces = nullptr);
  // pp inside the islands: n on every stage of the island's pipeline, in pp rank order (a
  // collective over pp; {n} without pp).
  std::vector<int64_t> numel_per_stage(int64_t n) const;
  // The group whose ranks hold different parts of the outer state inside an island: the island
  // under ZeRO-3 / HSDP, the tp group under tp, null when every rank holds all of it.
  comm::Communicator* outer_state_group() const;
  // ZeRO-3 inside the islands (sharded_islands.cpp): this rank's values, the owned ranges of flat_
  // packed (flat_ itself without ZeRO-3), in the layout of global_ and mom_; and the reverse.
  Tensor local_values() const;
  void set_local_values(const Tensor& v);
  // The ranges local_values() packs ({{0, n}} for the whole model), for matrices_within().
  std::vector<std::pair<int64_t, int64_t>> local_ranges() const;  // what start_average(numel) sends from this rank
  // One sync's record; blocked_s is the time the inner steps waited for it. Under pp,
  // stage_numels: what each stage sent in this sync (null: every stage its whole stage, DiLoCo).
  nlohmann::json record(const std::string& what, int64_t numel, double blocked_s, double sync_s,
                        const std::vector<int64_t>* stage_numels = nullptr);

  LowCommConfig c_;
  comm::Communicator* world_;
  std::unique_ptr<comm::Communicator> island_comm_;
  comm::Communicator* across_ = nullptr;
  // The ranks of this island that hold this rank's shard (its data-parallel group): each sends
  // 1/k of the shard's pseudo-gradient across, then they all-gather the means. The island's
  // ranks without tp; under tp the island's ranks with this tp coordinate.
  comm::Communicator* share_ = nullptr;
  comm::Communicator* tp_comm_ = nullptr;  // the island's tp group (tp > 1)
  const parallel::TensorParallel* tp_ctx_ = nullptr;  // tp > 1: its split rules (IsoLoCo's whole matrices)
  comm::Communicator* dp_comm_ = nullptr;  // tp > 1: the island's dp ranks of this tp coordinate
  // ZeRO-3 / HSDP: the ranks one shard of the model is cut over (their owned ranges partition it).
  comm::Communicator* zero_shard_ = nullptr;
  comm::Communicator *shard_axis_ = nullptr, *replica_axis_ = nullptr;  // the mesh's dp_shard, dp_replicate
  int tp_ = 1;
  // pp inside the islands: the island's pp group, the pipeline, the tied embedding's flat ranges
  // on this stage (first and last stage only), and every stage's local numel (for job bytes).
  int pp_ = 1;
  comm::Communicator* pp_comm_ = nullptr;
  comm::Communicator* stage_comm_ = nullptr;  // pp, or pp x tp: the ranks holding one pipeline's pieces
  const parallel::PipelineParallel* pipe_ = nullptr;
  std::vector<std::pair<int64_t, int64_t>> tied_;
  std::vector<int64_t> stage_numel_;
  std::vector<std::pair<int64_t, int64_t>> replicated_;  // flat ranges every tp rank holds whole
  std::vector<std::pair<int64_t, int64_t>> owned_;       // ZeRO-3: the flat ranges this rank keeps
  int island_ = 0, islands_ = 1;
  std::unique_ptr<PseudoGradientExchange> exchange_;
  nn::Model* model_ = nullptr;
  Tensor flat_;    // the model's flat parameters (this island's)
  Tensor global_;  // the outer (global) parameters, the same on every island
  Tensor mom_;     // outer momentum
  int64_t outer_steps_ = 0;
  std::unique_ptr<SyncController> sched_;
  int64_t due_step_ = -1;

 private:
  void save_exchange(std::vector<std::pair<std::string, Tensor>>& extra);
  // tensor_parallel_islands.cpp: refuses what tp inside the islands does not run; the outer
  // state's checkpoint names (per tp shard under tp).
  void setup_tensor_parallel(parallel::Mesh& mesh);
  // pipeline_islands.cpp: refuses what pp inside the islands does not run (naming the keys); the
  // stage's data-parallel ranks as the share group.
  void setup_pipeline(parallel::Mesh& mesh);
  void attach_pipeline(const std::string& strategy);
  void attach_shards(std::vector<std::pair<int64_t, int64_t>> owned, const std::string& strategy);  // sharded_islands.cpp
  void save_outer(std::vector<std::pair<std::string, Tensor>>& extra, nlohmann::json& st);
  void load_outer(const TensorFile& ours, const nlohmann::json& st, const std::string& what);
  void load_exchange(const TensorFile& ours, const nlohmann::json& st, const std::string& what);
  // For compute utilization: wall time between records and the time blocked in syncs within it.
  std::chrono::steady_clock::time_point window_start_;
  double window_blocked_s_ = 0;
  int64_t job_wan_bytes_ = 0;
  int64_t exchanges_ = 0;
  bool window_open_ = false;
  bool loaded_plain_ = false;
  bool guarded_once_ = false;
  std::vector<std::string> covered_;  // gather_whole's keys whose pieces' cover was checked
};

using MethodMaker = std::function<std::unique_ptr<LowComm>(const LowCommConfig&, parallel::Mesh&,
                                                           comm::Communicator*, Config&)>;
Registry<MethodMaker>& method_registry();

// [lowcomm] read and the method built; null when the job trains without islands.
std::unique_ptr<LowComm> make_lowcomm(Config& cfg, parallel::Mesh& mesh, comm::Communicator* world);

}  // namespace atl::lowcomm
