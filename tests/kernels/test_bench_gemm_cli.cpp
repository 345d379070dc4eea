// `atoll bench gemm --quick --json`: runs the real command and checks the file the trainer reads.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
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

namespace {
std::string bench_json(const std::string& env, int* rc) {
  const auto path = std::filesystem::temp_directory_path() / ("atoll_bench_isa_" + std::to_string(getpid()) + ".json");
  std::filesystem::remove(path);
  const std::string cmd = env + " " + std::string(ATOLL_BINARY_DIR) +
                          "/atoll bench gemm --quick --threads 1 --repeats 1 --json " + path.string() +
                          " > /dev/null 2>" + path.string() + ".err";
  *rc = std::system(cmd.c_str());
  std::ifstream f(*rc == 0 ? path : std::filesystem::path(path.string() + ".err"));
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  std::filesystem::remove(path.string() + ".err");
  return text;
}
}  // namespace

// ATOLL_ISA forces the kernel path of the whole process (oneDNN's included, since it is set
// before the first primitive): each supported path is reported as the one in use; an unknown
// or unsupported one stops the command with the reason.
TEST(BenchGemmCli, AtollIsaForcesEachSupportedPath) {
  int supported = 0;
  for (const char* isa : {"avx2", "avx512", "avx512_bf16", "amx"}) {
    int rc = 0;
    const std::string out = bench_json(std::string("ATOLL_ISA=") + isa, &rc);
    // What the CPU offers, from the kernel's own list (independent of atoll's detection).
    std::ifstream ci("/proc/cpuinfo");
    std::string cpuinfo((std::istreambuf_iterator<char>(ci)), std::istreambuf_iterator<char>());
    const bool has = std::string(isa) == "avx2"          ? cpuinfo.find(" avx2") != std::string::npos
                     : std::string(isa) == "avx512"      ? cpuinfo.find(" avx512bw") != std::string::npos
                     : std::string(isa) == "avx512_bf16" ? cpuinfo.find(" avx512_bf16") != std::string::npos
                                                         : cpuinfo.find(" amx_bf16") != std::string::npos;
    if (rc == 0) {
      ++supported;
      nlohmann::json j = nlohmann::json::parse(out);
      EXPECT_EQ(j.at("isa").get<std::string>(), isa);
      const std::string want = std::string(isa) == "amx"           ? "onednn-amx"
                               : std::string(isa) == "avx512_bf16" ? "onednn-avx512_bf16"
                                                                   : "portable";
      EXPECT_EQ(j.at("bf16_path").get<std::string>(), want);
      EXPECT_TRUE(has) << isa << " accepted, but /proc/cpuinfo does not list it";
    } else {
      EXPECT_NE(out.find("cannot run on this CPU"), std::string::npos) << isa << ": " << out;
      EXPECT_FALSE(has && std::string(isa) != "amx") << isa << " refused on a CPU that lists it: " << out;
    }
  }
  EXPECT_GE(supported, 1);
  int rc = 0;
  const std::string out = bench_json("ATOLL_ISA=avx1024", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("ATOLL_ISA"), std::string::npos) << out;
}
