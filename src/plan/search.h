// Layout search: enumerate every valid layout of a model over (sub-)clusters, keep those that
// fit in memory, rank them by throughput or by cost, and extract the cost-vs-time Pareto
// frontier.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plan/predict.h"

namespace atl::plan {

struct SearchOptions {
  int64_t global_batch = 0;       // sequences per step; 0: derived from batch_tokens
  double batch_tokens = 4e6;      // tokens per step when global_batch is 0
  double train_tokens = 1e12;
  std::string objective = "throughput";  // or "cost"
  bool vary_cluster = true;       // also try fewer nodes per island and fewer islands
  std::vector<int64_t> micro_batches = {1, 2, 4, 8};
  std::vector<std::string> recomputes = {"none", "selective", "full"};
  std::vector<int> zero_stages = {0, 1, 2, 3};
  std::string precision = "bf16";
  std::string optimizer = "adam";
  Layout decentral;               // diloco_h / compression / gossip copied into every layout
};

struct Candidate {
  Layout layout;
  int64_t nodes_per_island = 0, islands = 0;
  double step = 0, tokens_per_s = 0, mfu = 0, train_seconds = 0, train_cost = 0, mem_total = 0,
         mem_margin = 0;
  bool oom = false;
  std::string bottleneck;
};

struct SearchResult {
  int64_t evaluated = 0;  // valid layouts predicted
  int64_t rejected = 0;   // enumerated layouts that broke a constraint
  int64_t fits = 0;       // of the evaluated, those within memory
  std::vector<Candidate> ranked;  // fitting layouts, best first
  std::vector<Candidate> pareto;  // cost-vs-time frontier, fastest first
  std::vector<Candidate> all;     // every evaluated layout (for plots)
};

SearchResult search_layouts(const ModelSpec& m, const Cluster& c, const SearchOptions& o);

// Points not dominated in (train_seconds, train_cost), sorted by time.
std::vector<Candidate> pareto_frontier(std::vector<Candidate> v);

}  // namespace atl::plan
