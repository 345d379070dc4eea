// Training within a memory budget (issue 12, item 6; seed: "Mixture-of-Parallelisms", which
// gives attention and expert layers each their own parallelism): train.memory_budget_gb is the
// resident memory one rank may use. Before the mesh is resolved, the budget chooses what the
// config leaves open, cheapest in communication and offload first:
//   - the dense layers' (attention, router, shared experts, embeddings) data parallelism:
//     ddp, zero1, zero2 or zero3 over the ranks;
//   - the routed experts' parallelism: replicated with the dense layers (ep = 1), or sharded over
//     ep ranks (each storing E/ep experts, parallel/expert_shards.h) — resident state first;
//   - the optimizer state: resident, or in a memory-mapped file with the step streamed over it
//     (optim/state_file.h);
//   - tensor parallelism (session 9): a given parallel.tp is counted, and where the config leaves
//     it open, tp degrees the model's plan can split (heads, kv heads and the MLP width divisible)
//     are tried after every resident layout without tp and before offloading. Under tp a rank
//     holds 1/tp of what the plan splits (nn/parallel_plan.h: the column-, row- and
//     vocab-parallel tables) and the rest whole; ZeRO shards over the dp = ranks / tp ranks of
//     its tp coordinate; the routed experts stay whole on every tp rank (parallel/
//     expert_parallel.cpp), sharded over ep only; with sequence parallelism (the default) the
//     activations are 1/tp (Korthikanti et al. 2022), without it counted whole.
// Model states are counted as the plan's memory model counts them (plan/memory_model.h) and the
// activations as the preflight does (train/preflight.h). The choice is logged and reported in
// metrics.jsonl's first record; a budget nothing fits is refused naming the key and the
// smallest estimate. Master weights stay resident: on this fp32 CPU trainer they are the weights
// the forward reads (there is no low-precision copy to train on instead).
//
// Keys ([train]): memory_budget_gb (0: no budget), optimizer_state = "auto" | "resident" |
// "mmap", offload_dir (default: the system's temporary directory).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace atl {

struct BudgetModel {
  double dense_params = 0, expert_params = 0;  // the whole model's
  int64_t n_experts = 0;                      // 0: no experts
  int64_t ranks = 1;                          // the job's ranks (data parallel, and tp when chosen)
  double activations = 0;                     // bytes per rank (activations and logits), without tp
  // Of dense_params / expert_params, those the model's tensor-parallel plan splits over tp.
  double dense_split_params = 0, expert_split_params = 0;
  std::vector<int64_t> tp_options = {1};      // tp degrees the model can take (1: none)
  bool sequence_parallel = true;              // activations split over tp
};

struct BudgetLayout {
  std::string strategy = "ddp";  // the dense layers' data parallelism
  int64_t ep = 1;                // experts sharded over ep ranks (1: replicated with the dense layers)
  bool offload = false;          // optimizer state in a memory-mapped file
  double bytes = 0;              // estimated per-rank bytes
  int64_t tp = 1;                // tensor parallelism (1: none)
  std::string describe() const;
};

// Per-rank bytes of one layout.
double layout_bytes(const BudgetModel& m, const BudgetLayout& l);
// The layouts to try, in order of preference, given what is fixed (empty strategy, ep 0,
// offload -1 and tp 0: free).
std::vector<BudgetLayout> budget_candidates(const BudgetModel& m, const std::string& strategy, int64_t ep,
                                            int offload, int64_t tp = 0);
// The first candidate within budget_bytes; throws naming train.memory_budget_gb otherwise.
BudgetLayout choose_layout(const BudgetModel& m, double budget_bytes, const std::string& strategy = "",
                           int64_t ep = 0, int offload = -1, int64_t tp = 0);

struct MemoryBudget {
  double budget_gb = 0;     // 0: none
  BudgetLayout chosen;
  bool offload = false;     // the optimizer state is offloaded (chosen, or train.optimizer_state = "mmap")
  std::string offload_dir;
  std::string report;       // what was chosen and why, for the log
};

// Reads the [train] keys and, with a budget, chooses the layout and writes it into cfg as
// overrides of the keys the config left unset (parallel.strategy, parallel.ep, parallel.tp). Builds the model
// once to count its parameters. batch/seq: the micro-batch; world: the job's ranks.
MemoryBudget apply_memory_budget(Config& cfg, int64_t batch, int64_t seq, int64_t world);

}  // namespace atl
