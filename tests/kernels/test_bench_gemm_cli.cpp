// `atoll bench gemm --quick --json`: runs the real command and checks the file the trainer reads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>

TEST(BenchGemmCli, WritesPeakJson) {
  const auto path = std::filesystem::temp_directory_path() / ("atoll_bench_gemm_" + std::to_string(getpid()) + ".json");
  const std::string cmd = std::string(ATOLL_BINARY_DIR) + "/atoll bench gemm --quick --threads 1 --repeats 1 --json " +
                          path.string() + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  nlohmann::json j;
  f >> j;
  std::filesystem::remove(path);
  EXPECT_GT(j.at("fp32_gflops").get<double>(), 0.0);
  EXPECT_GT(j.at("bf16_gflops").get<double>(), 0.0);
  EXPECT_EQ(j.at("threads").get<int>(), 1);
  double best = 0;
  for (auto& s : j.at("sizes")) best = std::max(best, s.at("fp32_gflops").get<double>());
  EXPECT_DOUBLE_EQ(best, j.at("fp32_gflops").get<double>());  // the peak is the best size
}

TEST(BenchGemmCli, RejectsBadOptions) {
  const std::string cmd = std::string(ATOLL_BINARY_DIR) + "/atoll bench gemm --quick --repeats 0 2> /dev/null";
  EXPECT_NE(std::system(cmd.c_str()), 0);
}
