// The example inputs in configs/plan/ are read through atl::Config and predicted, so they stay
// valid as the planner changes. The cpu-local example gets a calibration file written here.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/config.h"
#include "plan/plan_input.h"
#include "plan/predict.h"

using namespace atl;
using namespace atl::plan;

TEST(PlanConfigs, EveryExampleReadsAndPredicts) {
  auto dir = std::filesystem::path(ATOLL_SOURCE_DIR) / "configs" / "plan";
  auto cal = std::filesystem::temp_directory_path() / "atoll_plan_test_calibration.json";
  {
    std::ofstream f(cal);
    f << R"({"peak_fp32_flops": 1e11, "memory_bytes": 16e9, "memory_bandwidth": 2e10,
             "gemm_curve": [[1e6, 0.2], [1e8, 0.6], [1e10, 0.9]]})";
  }
  setenv("ATOLL_PLAN_CALIBRATION", cal.c_str(), 1);
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".toml") continue;
    Config c = Config::load(e.path().string());
    PlanInput in = read_plan_input(c);
    Prediction p = predict(in.model, in.cluster, in.layout);
    EXPECT_GT(p.tokens_per_s, 0) << e.path();
    EXPECT_FALSE(p.memory.oom) << e.path() << " does not fit: margin " << p.memory.margin;
    EXPECT_FALSE(p.bottleneck.empty());
    ++n;
  }
  unsetenv("ATOLL_PLAN_CALIBRATION");
  std::filesystem::remove(cal);
  EXPECT_GE(n, 4);
}

TEST(PlanConfigs, CalibratedCpuDeviceUsesItsCurve) {
  auto cal = std::filesystem::temp_directory_path() / "atoll_plan_test_curve.json";
  {
    std::ofstream f(cal);
    f << R"({"peak_fp32_flops": 2e11, "memory_bytes": 8e9, "memory_bandwidth": 1e10,
             "gemm_curve": [[1e8, 0.8], [1e6, 0.1]]})";
  }
  Device d = device_from_calibration(cal.string());
  EXPECT_EQ(d.name, "cpu-local");
  EXPECT_DOUBLE_EQ(d.peak("fp32"), 2e11);
  EXPECT_DOUBLE_EQ(d.gemm_efficiency(1e6), 0.1);  // points are sorted on load
  EXPECT_DOUBLE_EQ(d.gemm_efficiency(1e8), 0.8);
  EXPECT_NEAR(d.gemm_efficiency(1e7), 0.45, 1e-12);  // log-linear in between
  std::filesystem::remove(cal);
}
