#include "train/memory_budget.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "core/log.h"
#include "nn/moe.h"
#include "nn/model.h"
#include "nn/tensor_parallel.h"
#include "plan/memory_model.h"
#include "tensor/allocator.h"
#include "train/preflight.h"

namespace atl {

namespace {
int zero_stage(const std::string& s) {
  return s == "zero1" ? 1 : s == "zero2" ? 2 : (s == "zero3" || s == "hsdp") ? 3 : 0;
}
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
}  // namespace

std::string BudgetLayout::describe() const {
  return fmt::format("dense layers {}{}, experts {}, optimizer state {}", strategy,
                     tp > 1 ? fmt::format(" x tp = {}", tp) : std::string(),
                     ep > 1 ? fmt::format("sharded over ep = {}", ep) : std::string("with the dense layers"),
                     offload ? "in a memory-mapped file (streamed step)" : "resident");
}

double layout_bytes(const BudgetModel& m, const BudgetLayout& l) {
  plan::StateBytes sb = plan::state_bytes("fp32", "adam");
  if (l.offload) sb.optim = 0;  // one stream chunk resident at a time: negligible
  const int stage = zero_stage(l.strategy);
  const double tp = double(std::max<int64_t>(1, l.tp));
  // A rank's share under tp: 1/tp of what the plan splits, the rest whole.
  const double dense = m.dense_params - m.dense_split_params + m.dense_split_params / tp;
  // The dense layers (and the experts when they are not sharded) under the strategy, over the dp
  // = ranks / tp ranks of a tp coordinate; sharded experts: E/ep of them per rank, each whole
  // (replicated over ranks / ep, not sharded further, not split by tp).
  const double experts = l.ep > 1 ? m.expert_params : m.expert_params - m.expert_split_params + m.expert_split_params / tp;
  const int64_t dp = std::max<int64_t>(1, m.ranks / std::max<int64_t>(1, l.tp));
  double b = plan::zero_model_state_bytes(dense + (l.ep > 1 ? 0 : experts), stage, dp, sb);
  if (l.ep > 1) b += (sb.weight + sb.grad + sb.optim) * experts / double(l.ep);
  return b + (m.sequence_parallel ? m.activations / tp : m.activations);
}

std::vector<BudgetLayout> budget_candidates(const BudgetModel& m, const std::string& strategy, int64_t ep,
                                            int offload, int64_t tp_fixed) {
  std::vector<std::string> strategies = strategy.empty() ? std::vector<std::string>{"ddp", "zero1", "zero2", "zero3"}
                                                         : std::vector<std::string>{strategy};
  if (m.ranks == 1 && strategy.empty()) strategies = {"ddp"};  // one rank: nothing to shard over
  std::vector<int64_t> eps;
  if (ep > 0) eps = {ep};
  else
    for (int64_t e = 1; e <= m.ranks; ++e)
      if (m.ranks % e == 0 && (e == 1 || (m.n_experts > 0 && m.n_experts % e == 0))) eps.push_back(e);
  // tp: the fixed degree, else none first, then each degree the model takes (its per-layer
  // collectives cost more than ZeRO's per-step ones, less than streaming the optimizer state).
  std::vector<int64_t> tps;
  if (tp_fixed > 0) tps = {tp_fixed};
  else
    for (int64_t t : m.tp_options)
      if (t >= 1 && m.ranks % t == 0) tps.push_back(t);
  if (tps.empty()) tps = {1};
  std::vector<BudgetLayout> out;
  for (bool off : {false, true}) {
    if (offload >= 0 && off != (offload == 1)) continue;
    for (int64_t t : tps) {
      const int64_t dp = m.ranks / t;  // ep is carved out of the data-parallel axis (parallel/mesh.h)
      for (const std::string& s : strategies) {
        if (dp == 1 && s != "ddp" && strategy.empty()) continue;  // nothing to shard over
        for (int64_t e : eps) {
          if (e > 1 && (s == "ddp" || dp % e)) continue;
          BudgetLayout l{s, e, off, 0, t};
          l.bytes = layout_bytes(m, l);
          out.push_back(l);
        }
      }
    }
  }
  return out;
}

BudgetLayout choose_layout(const BudgetModel& m, double budget_bytes, const std::string& strategy, int64_t ep,
                           int offload, int64_t tp) {
  auto c = budget_candidates(m, strategy, ep, offload, tp);
  ATOLL_CHECK(!c.empty(), "train.memory_budget_gb: no layout to choose from (parallel.strategy = '{}', parallel.ep = "
              "{})", strategy, ep);
  for (const BudgetLayout& l : c)
    if (l.bytes <= budget_bytes) return l;
  const BudgetLayout& best = *std::min_element(c.begin(), c.end(), [](auto& a, auto& b) { return a.bytes < b.bytes; });
  fail("train.memory_budget_gb = {:.4g}: no layout fits; the smallest estimate is {:.4g} GiB per rank ({}) over {} "
       "ranks; raise the budget, add ranks, or reduce train.batch_size / the model",
       budget_bytes / kGiB, best.bytes / kGiB, best.describe(), m.ranks);
}

MemoryBudget apply_memory_budget(Config& cfg, int64_t batch, int64_t seq, int64_t world) {
  MemoryBudget mb;
  mb.budget_gb = cfg.get_float("train.memory_budget_gb", 0.0, 0.0, 1e6);
  const std::string state = cfg.get_string("train.optimizer_state", "auto", {"auto", "resident", "mmap"});
  mb.offload_dir = cfg.get_string("train.offload_dir", std::filesystem::temp_directory_path().string());
  mb.offload = state == "mmap";
  if (mb.budget_gb <= 0) return mb;
  for (const char* k : {"parallel.pp", "parallel.cp", "parallel.islands"})
    ATOLL_CHECK(!cfg.has(k) || cfg.get_int(k, 1) == 1, "train.memory_budget_gb chooses data, tensor and expert "
                "parallelism; it does not compose with {} > 1 yet ({})", k, cfg.where(k));
  BudgetModel m;
  m.ranks = std::max<int64_t>(1, world);
  const int64_t tp_fixed = cfg.has("parallel.tp") ? cfg.get_int("parallel.tp", 1, 1, 1 << 20) : 0;
  m.sequence_parallel = cfg.get_bool("parallel.sequence_parallel", true);
  {
    // Counted, then dropped (built at full size once: a transient peak before training starts).
    std::unique_ptr<nn::Model> model = nn::make_model(cfg, "model");
    const nn::ParallelPlan plan = model->parallelize();
    for (nn::Parameter* p : model->parameters()) {
      const bool expert = p->role == ParamRole::expert;
      const double n = double(shape_numel(p->shape));
      (expert ? m.expert_params : m.dense_params) += n;
      if (plan.make_tp_shard && nn::shard_rule(plan, p->name, p->shape).sharded())
        (expert ? m.expert_split_params : m.dense_split_params) += n;
    }
    // The tp degrees its plan splits evenly: heads, kv heads and the MLP width (a vocabulary
    // splits unevenly, 128 + 129). Varlen (DCP) jobs run over data-parallel ranks only.
    std::optional<nn::TransformerShape> shape = model->transformer_shape();
    if (plan.make_tp_shard && shape && !cfg.has("data.varlen_tokens") && world > 1)
      for (int64_t t = 2; t <= m.ranks; t *= 2)
        if (m.ranks % t == 0 && shape->heads % t == 0 && shape->kv_heads % t == 0 && shape->ffn % t == 0)
          m.tp_options.push_back(t);
    TrainShape ts;
    ts.batch_size = batch, ts.seq_len = seq;
    MemoryEstimate e = estimate_training_memory(*model, ts);
    m.activations = e.activations + e.logits;
    if (auto* em = dynamic_cast<nn::ExpertModel*>(model.get())) {
      m.n_experts = em->num_experts();
      const double a = em->activation_bytes(batch, seq);  // the preflight has no shape for it
      if (a > 0) m.activations = a;
    }
  }
  allocator_for(Device::cpu()).release_cache();  // the counted model's buffers go back to the system
  const bool strategy_fixed = cfg.has("parallel.strategy") || cfg.has("parallel.zero") || cfg.has("parallel.hsdp") ||
                              cfg.has("parallel.dp_shard") || cfg.has("parallel.dp_replicate");
  std::string strategy;
  if (cfg.has("parallel.strategy")) strategy = cfg.get_string("parallel.strategy", "ddp");
  else if (strategy_fixed) strategy = cfg.get_int("parallel.dp_shard", 1) > 1 ? "zero3" : "ddp";  // the mesh's reading
  const int64_t ep = cfg.has("parallel.ep") ? cfg.get_int("parallel.ep", 1, 1, 1 << 20) : 0;
  const int offload = state == "auto" ? -1 : state == "mmap" ? 1 : 0;
  mb.chosen = choose_layout(m, mb.budget_gb * kGiB, strategy, ep, offload, tp_fixed);
  if (!strategy_fixed) cfg.set_override("parallel.strategy=" + mb.chosen.strategy);
  if (tp_fixed == 0 && mb.chosen.tp > 1) cfg.set_override("parallel.tp=" + std::to_string(mb.chosen.tp));
  if (ep == 0 && mb.chosen.ep > 1) cfg.set_override("parallel.ep=" + std::to_string(mb.chosen.ep));
  mb.offload = mb.chosen.offload;
  const BudgetLayout plain{"zero3", 1, false, 0, std::max<int64_t>(1, tp_fixed)};
  mb.report = fmt::format("memory budget {:.4g} GiB per rank: {} (estimate {:.4g} GiB per rank; plain zero3 over {} "
                          "ranks: {:.4g} GiB)", mb.budget_gb, mb.chosen.describe(), mb.chosen.bytes / kGiB, m.ranks,
                          layout_bytes(m, plain) / kGiB);
  return mb;
}

}  // namespace atl
