// Bad input: impossible layouts name the constraint, unknown names list the known ones,
// malformed files name the key and line.
#include <gtest/gtest.h>

#include "core/config.h"
#include "core/error.h"
#include "plan/plan_input.h"
#include "plan/predict.h"

using namespace atl;
using namespace atl::plan;

namespace {
std::string error_of(const ModelSpec& m, const Cluster& c, const Layout& l) {
  try {
    predict(m, c, l);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(PlanLayout, ImpossibleLayoutsNameTheirConstraint) {
  ModelSpec m = model_preset("gpt2-124m");  // 12 heads, 12 layers
  Cluster c = make_cluster(find_device("a100-80gb"), 8, 2, 1);  // 16 devices
  Layout l;
  l.dp = 2, l.tp = 8;
  EXPECT_NE(error_of(m, c, l).find("tp (8) must divide the attention heads (12)"), std::string::npos) << error_of(m, c, l);
  l = Layout{};
  l.pp = 16;
  EXPECT_NE(error_of(m, c, l).find("pp (16) must not exceed the number of layers (12)"), std::string::npos)
      << error_of(m, c, l);
  l = Layout{};
  l.dp = 3, l.tp = 4;
  EXPECT_NE(error_of(m, c, l).find("world size"), std::string::npos) << error_of(m, c, l);
  EXPECT_NE(error_of(m, c, l).find("= 12 must equal the cluster's devices"), std::string::npos) << error_of(m, c, l);
  l = Layout{};
  l.dp = 16, l.global_batch = 24;
  EXPECT_NE(error_of(m, c, l).find("global_batch (24) must be a multiple of dp × micro_batch"), std::string::npos);
  l = Layout{};
  l.dp = 16, l.ep = 2;
  EXPECT_NE(error_of(m, c, l).find("needs a mixture-of-experts model"), std::string::npos);
  l = Layout{};
  l.dp = 4, l.pp = 4, l.schedule = "interleaved", l.virtual_stages = 4;
  EXPECT_NE(error_of(m, c, l).find("pp×virtual_stages (4×4) must not exceed the layers (12)"), std::string::npos)
      << error_of(m, c, l);
  // Uneven interleaved stages are allowed (issue 16): 12 layers in 2×4 chunks of 1-2 layers.
  l = Layout{};
  l.dp = 8, l.pp = 2, l.schedule = "interleaved", l.virtual_stages = 4, l.global_batch = 16;
  EXPECT_EQ(error_of(m, c, l), "");
  l = Layout{};
  l.dp = 16, l.diloco_h = 100;
  EXPECT_NE(error_of(m, c, l).find("islands > 1"), std::string::npos);
  l = Layout{};
  l.dp = 16;
  EXPECT_EQ(error_of(m, c, l), "");
}

TEST(PlanLayout, UnknownDeviceListsTheCatalog) {
  try {
    find_device("h100");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    for (const char* d : {"a100-40gb", "h100-sxm", "h100-pcie", "h200", "b200", "b300", "gb10", "rtx6000-ada",
                          "rtx4090", "rtx3090", "mi300x", "l40s", "cpu-local"})
      EXPECT_NE(m.find(d), std::string::npos) << d << " missing from: " << m;
  }
}

TEST(PlanLayout, CpuLocalWithoutCalibrationSaysHowToCalibrate) {
  setenv("ATOLL_PLAN_CALIBRATION", "/nonexistent/plan_calibration.json", 1);
  try {
    find_device("cpu-local");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("atoll plan calibrate"), std::string::npos) << e.what();
  }
  unsetenv("ATOLL_PLAN_CALIBRATION");
}

TEST(PlanLayout, PlanFileIsReadWithFileLineErrors) {
  const char* text =
      "[model]\npreset = \"llama2-7b\"\n\n[cluster]\ndevice = \"h100-sxm\"\nnodes_per_island = 2\n"
      "[cluster.inter_node]\nbandwidth_gbs = 40\nlatency_us = 5\n\n[plan]\ntp = 4\nzero = 1\nglobal_batch = 64\n"
      "recompute = \"selective\"\n[run]\ntokens = 2e11\n";
  Config ok = Config::parse(text, "p.toml");
  PlanInput in = read_plan_input(ok);
  EXPECT_EQ(in.cluster.world(), 16);
  EXPECT_EQ(in.layout.dp, 4);  // derived: 16 / tp
  EXPECT_DOUBLE_EQ(in.cluster.inter.bw, 40e9);
  EXPECT_DOUBLE_EQ(in.cluster.inter.latency, 5e-6);
  EXPECT_DOUBLE_EQ(in.train_tokens, 2e11);

  Config typo2 = Config::parse("[plan]\ntp = 2\nzer0 = 1\n", "q.toml");
  try {
    read_plan_input(typo2);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("q.toml:3"), std::string::npos) << m;
    EXPECT_NE(m.find("plan.zero"), std::string::npos) << m;
  }
  Config wrong = Config::parse("[plan]\nrecompute = \"some\"\n", "r.toml");
  try {
    read_plan_input(wrong);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("r.toml:2"), std::string::npos) << m;
    EXPECT_NE(m.find("selective"), std::string::npos) << m;
  }
  Config indivisible = Config::parse("[cluster]\nnodes_per_island = 1\n[plan]\ntp = 3\n", "s.toml");
  EXPECT_THROW(read_plan_input(indivisible), Error);
}
