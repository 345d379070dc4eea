// Predicted-vs-published comparison: reads published runs (configs/plan/validation/*.toml),
// predicts each with the same model and reports the errors. Used by tests/plan and by
// `atoll plan validate`, which prints the table in docs/plan.md.
#pragma once
#include <string>
#include <vector>

#include "plan/predict.h"

namespace atl::plan {

struct PublishedRun {
  // metric: "tflops_per_gpu" (Megatron eq. 3, recompute included), "iteration_s", "mfu" (model
  // FLOPs per token × tokens/s per device / peak) or "tokens_per_s_per_gpu".
  std::string id, source, metric;
  std::string assumed;  // inputs the source does not state, and the value taken
  ModelSpec model;
  Layout layout;
  Cluster cluster;
  double published = 0;
};

struct ValidationRow {
  PublishedRun run;
  double predicted = 0;
  double rel_error = 0;  // (predicted - published) / published
};

// The two Megatron tables (configs/plan/validation/published.toml: GPT shapes on Selene).
std::vector<PublishedRun> load_published(const std::string& path);
// The extended set (configs/plan/validation/extended.toml): every run a full planner input under
// [runs.ID.model], [runs.ID.cluster] and [runs.ID.plan], with source, metric, published, assumed.
std::vector<PublishedRun> load_extended(const std::string& path);
std::vector<ValidationRow> validate_published(const std::vector<PublishedRun>& runs);
double median_abs_error(const std::vector<ValidationRow>& rows);
double max_abs_error(const std::vector<ValidationRow>& rows);

}  // namespace atl::plan
