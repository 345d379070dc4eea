#include "parallel/optim/placement.h"

#include <set>

#include "optim/param_groups.h"
#include "parallel/optim/tp_whole_matrix.h"

namespace atl::parallel {

Registry<ReplicatedPlacement>& replicated_placements() {
  static Registry<ReplicatedPlacement> r("replicated optimizer placement");
  return r;
}

Registry<ShardedPlacement>& sharded_placements() {
  static Registry<ShardedPlacement> r("sharded optimizer placement");
  return r;
}

OptimizerPlacement place_optimizer(Config& cfg, nn::Model& model, comm::Communicator* comm, bool sharding,
                                   const std::string& strategy, TensorParallel* tp) {
  OptimizerPlacement out;
  out.adamw = adamw_config_from(cfg);
  OptimizerRoute route = optimizer_route(cfg);
  for (const auto& n : replicated_placements().names())
    if (replicated_placements().get(n).keys) replicated_placements().get(n).keys(cfg);
  // Plain AdamW everywhere (also when a group is routed to "adamw" explicitly) keeps checkpoints
  // interchangeable between the strategies; the strategy builds it (sharded or not) from adamw.
  bool grouped = route.hidden != "adamw" || route.embed != "adamw" || route.head != "adamw" || route.vector != "adamw";
  if (!grouped) return out;
  if (sharding) {
    // ZeRO shards the optimizer over equal flat chunks: the hidden-matrix optimizer needs a
    // sharded form, AdamW takes everything else.
    std::string shardable;
    for (const auto& n : sharded_placements().names()) shardable += (shardable.empty() ? "" : ", ") + n;
    std::string hint = replicated_placements().has(route.hidden) ? replicated_placements().get(route.hidden).describe : "";
    ATOLL_CHECK(sharded_placements().has(route.hidden),
                "[optim] type = '{}' cannot run under parallel.strategy = '{}': ZeRO shards {} only; use "
                "parallel.strategy = 'ddp'{}", route.hidden, strategy, shardable, hint.empty() ? "" : " (" + hint + ")");
    for (auto [g, t] : {std::pair<const char*, const std::string*>{"embed", &route.embed}, {"head", &route.head},
                        {"vector", &route.vector}})
      ATOLL_CHECK(*t == "adamw", "optim.{} = '{}' cannot run under parallel.strategy = '{}': ZeRO shards the groups "
                  "besides the hidden matrices with AdamW only; remove the key or use parallel.strategy = 'ddp'",
                  g, *t, strategy);
    const ShardedPlacement& p = sharded_placements().get(route.hidden);
    out.sharded = p.make(cfg, out.adamw, tp);  // under tp: each split matrix updated whole
    if (comm && comm->size() > 1) out.note = p.note;
    return out;
  }
  // Under tp the whole-matrix types take their tp form, every dp rank stepping its tp group's
  // matrices whole (the replicated forms split work over a comm that tp's blocks do not span).
  const TpOverride tp_form = tensor_parallel_override(tp);
  OptimizerOverride distributed = [&](Config& c, const std::string& type, std::vector<ParamRef>& ps) {
    std::unique_ptr<Optimizer> o;
    if (tp_form) {
      if ((o = tp_form(c, type, ps)) && out.note.find("over tp") == std::string::npos)
        out.note += " (" + type + "'s " + tensor_parallel_placements().get(type).describe + ")";
      return o;
    }
    if (!comm || !replicated_placements().has(type)) return o;
    std::string note;
    o = replicated_placements().get(type).make(c, ps, comm, note);
    if (o) out.note += note;
    return o;
  };
  out.full = make_optimizer(cfg, model.param_refs(), distributed);  // reads (and so validates) its keys
  return out;
}

OptimizerPlacement place_pipeline_optimizer(Config& cfg, TensorParallel* tp) {
  OptimizerPlacement out;
  out.adamw = adamw_config_from(cfg);
  OptimizerRoute route = optimizer_route(cfg);
  // The distributed forms' keys stay valid (a pipeline steps the single-rank forms: its ranks'
  // parameters are already disjoint and whole).
  for (const auto& n : replicated_placements().names())
    if (replicated_placements().get(n).keys) replicated_placements().get(n).keys(cfg);
  const bool grouped = route.hidden != "adamw" || route.embed != "adamw" || route.head != "adamw" || route.vector != "adamw";
  if (!grouped) return out;  // plain AdamW, as every other strategy builds it: checkpoints interchange
  // Each routed type built once over no parameters: its section's keys are read (and range-checked)
  // now, before the unknown-key check, though the ranks build theirs once the stages are laid out.
  std::set<std::string> types = {route.hidden, route.embed, route.head, route.vector};
  for (const std::string& t : types) make_single_optimizer(cfg, t, {});
  out.per_rank = [&cfg, tp](std::vector<ParamRef> params) {
    return make_optimizer(cfg, std::move(params), tensor_parallel_override(tp));
  };
  return out;
}

}  // namespace atl::parallel
