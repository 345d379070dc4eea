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
  // Issue 16: no worse on these tables than before its corrections (median 5.2%, worst 14.7%),
  // nor than session 6 left them (3.0%, 13.8%; the flash-kernel terms of session 7 do not touch
  // these standard-attention runs).
  EXPECT_LE(med, 0.052) << "median |error| " << med;
  EXPECT_LE(worst, 0.147) << "worst |error| " << worst;
  EXPECT_LE(med, 0.031) << "median |error| " << med;
  EXPECT_LE(worst, 0.139) << "worst |error| " << worst;
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

// The extended set (configs/plan/validation/extended.toml): ZeRO-3/FSDP at scale, 3D parallelism
// and context parallelism on H100s (Llama 3), an MoE run (DeepSeek-V3), small-lab runs. Its error
// is reported separately from the Megatron tables and held to the issue's target (median ≤ 10%,
// worst ≤ 25%), met since session 7 with the kernel the MosaicML tables ran (Triton
// FlashAttention) and recompute charged forwards only (docs/plan.md, "The extended set").
TEST(PlanValidation, ExtendedSetCoversTheIssuesCategories) {
  auto ext = validate_published(load_extended(std::string(ATOLL_SOURCE_DIR) + "/configs/plan/validation/extended.toml"));
  ASSERT_GE(ext.size(), 10u);
  int fsdp = 0, cp = 0, moe = 0, h100_3d = 0, small = 0;
  for (auto& x : ext) {
    EXPECT_FALSE(x.run.source.empty()) << x.run.id;
    EXPECT_GT(x.predicted, 0) << x.run.id;
    EXPECT_TRUE(std::isfinite(x.rel_error)) << x.run.id;
    std::printf("  %-28s %-24s published %10.4g predicted %10.4g  %+6.1f%%\n", x.run.id.c_str(), x.run.source.c_str(),
                x.run.published, x.predicted, 100 * x.rel_error);
    fsdp += x.run.layout.zero == 3 && x.run.cluster.world() >= 64;
    cp += x.run.layout.cp > 1;
    moe += x.run.model.is_moe() && x.run.layout.ep > 1;
    h100_3d += x.run.cluster.device.name == "h100-sxm" && x.run.layout.tp > 1 && x.run.layout.pp > 1;
    small += x.run.cluster.world() <= 8;
  }
  EXPECT_GE(fsdp, 3);
  EXPECT_GE(cp, 1);
  EXPECT_GE(moe, 1);
  EXPECT_GE(h100_3d, 2);
  EXPECT_GE(small, 2);
  const double med = median_abs_error(ext), worst = max_abs_error(ext);
  std::printf("  extended set: median |error| %.1f%%, worst %.1f%%\n", 100 * med, 100 * worst);
  EXPECT_LE(med, 0.10) << "the issue's target: median |error| <= 10%";
  EXPECT_LE(worst, 0.25) << "the issue's target: worst |error| <= 25%";
}
