// Predicted-vs-published comparison: reads published runs (configs/plan/validation/*.toml),
// predicts each with the same model and reports the errors. Used by tests/plan and by
// `atoll plan validate`, which prints the table in docs/plan.md.
#pragma once
#include <string>
#include <vector>

#include "plan/predict.h"

namespace atl::plan {

struct PublishedRun {
  std::string id, source, metric;  // metric: "tflops_per_gpu" or "iteration_s"
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

std::vector<PublishedRun> load_published(const std::string& path);
std::vector<ValidationRow> validate_published(const std::vector<PublishedRun>& runs);
double median_abs_error(const std::vector<ValidationRow>& rows);
double max_abs_error(const std::vector<ValidationRow>& rows);

}  // namespace atl::plan
