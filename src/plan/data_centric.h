// Data-Centric Parallel, the chooser (issue 12, item 5; seed: "Training Variable Long Sequences
// with Data-Centric Parallel"): instead of one static configuration for every batch of a
// variable-length corpus, each batch's sequence lengths choose its context-parallel degree (data
// parallelism over the rest of the ranks), its gradient-accumulation split and its recomputation
// policy, by plan's cost model (plan/predict.h: step time and memory of each candidate). Short
// batches of many sequences get pure data parallelism with few micro-batches and no recompute;
// one long sequence gets context parallelism (and recompute where activations would not fit).
//
// A batch's sequences are padded to its longest (rounded to the cp degree); the ranks of one cp
// group share a sequence, the dp = world / cp groups split the batch, and accum micro-batches of
// micro_batch sequences each make up a rank's share. Candidates that exceed a device's memory
// are left out; of the rest the fastest predicted step wins (ties: smaller cp, fewer micro-steps).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/model_spec.h"

namespace atl::plan {

struct DcpJob {
  ModelSpec model;     // seq is set per batch
  Cluster cluster;
  int64_t world = 1;   // ranks of the job
  int64_t max_accum = 8;
  std::vector<std::string> recompute = {"none", "selective", "full"};
  std::string precision = "bf16";
  int zero = 1;
};

struct DcpChoice {
  int64_t cp = 1, dp = 1, accum = 1, micro_batch = 1, seq = 0;
  std::string recompute = "none";
  double step_s = 0, memory_bytes = 0;
  bool fits = false;
  std::string describe() const;
  bool same_config(const DcpChoice& o) const {
    return cp == o.cp && accum == o.accum && micro_batch == o.micro_batch && recompute == o.recompute;
  }
};

// One configuration's prediction for a batch of these lengths.
DcpChoice predict_config(const DcpJob& job, const std::vector<int64_t>& lengths, int64_t cp, int64_t accum,
                         const std::string& recompute);
// Every candidate for a batch of these lengths, predicted (fits false: over memory).
std::vector<DcpChoice> dcp_candidates(const DcpJob& job, const std::vector<int64_t>& lengths);
// The fastest candidate that fits; throws when none does.
DcpChoice choose_dcp(const DcpJob& job, const std::vector<int64_t>& lengths);
// The best single configuration for all these batches (the static baseline): the (cp, accum,
// recompute) that fits every batch with the smallest summed predicted time (total_s); the
// returned choice is its prediction for the first batch.
DcpChoice best_static(const DcpJob& job, const std::vector<std::vector<int64_t>>& batches, double* total_s = nullptr);

}  // namespace atl::plan
