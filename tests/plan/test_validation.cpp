// Accuracy against published measurements: Narayanan et al. 2021 Table 1 (achieved TFLOP/s per
// A100) and Korthikanti et al. 2022 Table 5 (iteration times with full vs selective recompute).
// The data live in configs/plan/validation/published.toml; nothing is tuned per row.
#include <gtest/gtest.h>

#include <cmath>

#include "plan/validation.h"

using namespace atl::plan;

namespace {
std::vector<ValidationRow> rows() {
  static auto r = validate_published(load_published(std::string(ATOLL_SOURCE_DIR) + "/configs/plan/validation/published.toml"));
  return r;
}
}  // namespace

TEST(PlanValidation, AllPublishedRunsArePredicted) {
  auto r = rows();
  ASSERT_EQ(r.size(), 18u);
  int narayanan = 0, korthikanti = 0;
  for (auto& x : r) {
    narayanan += x.run.source.find("Narayanan") != std::string::npos;
    korthikanti += x.run.source.find("Korthikanti") != std::string::npos;
    EXPECT_GT(x.predicted, 0) << x.run.id;
  }
  EXPECT_EQ(narayanan, 10);
  EXPECT_EQ(korthikanti, 8);
}

TEST(PlanValidation, MedianErrorAtMostTenPercentWorstAtMostTwenty) {
  auto r = rows();
  double med = median_abs_error(r), worst = max_abs_error(r);
  for (auto& x : r) std::printf("  %-26s published %8.3f predicted %8.3f  %+5.1f%%\n", x.run.id.c_str(), x.run.published, x.predicted, 100 * x.rel_error);
  EXPECT_LE(med, 0.10) << "median |error| " << med;
  EXPECT_LE(worst, 0.20) << "worst |error| " << worst;
}

TEST(PlanValidation, SelectiveRecomputeSpeedupHasThePublishedSize) {
  // Korthikanti et al. report 29-32% higher throughput with sp + selective recompute.
  auto r = rows();
  for (size_t i = 0; i + 1 < r.size(); ++i) {
    if (r[i].run.metric != "iteration_s" || r[i].run.layout.recompute != "full") continue;
    const auto& full = r[i];
    const auto& present = r[i + 1];
    ASSERT_EQ(present.run.layout.recompute, "selective");
    double published = full.run.published / present.run.published, predicted = full.predicted / present.predicted;
    EXPECT_NEAR(predicted, published, 0.08) << full.run.id;
  }
}
