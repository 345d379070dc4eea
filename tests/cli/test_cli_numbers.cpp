// Numeric flags and config paths of the `atoll` command refused with the flag named (issue 10,
// list 9): `launch --nproc-per-node 0` printed a 300-digit range, `plan --nodes 0`, `--tokens -1`
// and `--tokens nan` were silently ignored, and an empty config trained the default model.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

namespace {

namespace fs = std::filesystem;

const std::string& atoll() {
  static const std::string p = std::string(ATOLL_BINARY_DIR) + "/atoll";
  return p;
}

// Runs `atoll ARGS`; returns the exit status and the output (stdout + stderr).
int run(const std::string& args, std::string* out) {
  FILE* p = ::popen((atoll() + " " + args + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
  int st = ::pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

void expect_refused(const std::string& args, const std::string& flag, const std::string& needle) {
  std::string out;
  int rc = run(args, &out);
  EXPECT_NE(rc, 0) << args << "\n" << out;
  EXPECT_NE(out.find(flag), std::string::npos) << args << "\n" << out;
  EXPECT_NE(out.find(needle), std::string::npos) << args << "\n" << out;
  // No number in the message runs to dozens of digits (CLI11's PositiveNumber printed DBL_MAX).
  EXPECT_FALSE(std::regex_search(out, std::regex("[0-9]{25}"))) << args << "\n" << out;
}

TEST(CliNumbers, LaunchRefusesRankCountsThatAreNotPositiveIntegers) {
  ASSERT_TRUE(fs::exists(atoll())) << atoll();
  expect_refused("launch --nproc-per-node 0 -- true", "--nproc-per-node",
                 "must be an integer from 1 to 4096, got '0'");
  expect_refused("launch --nproc-per-node -2 -- true", "--nproc-per-node", "got '-2'");
  expect_refused("launch --nproc-per-node two -- true", "--nproc-per-node", "got 'two'");
  expect_refused("launch --nproc-per-node 1.5 -- true", "--nproc-per-node", "got '1.5'");
  expect_refused("launch --nnodes 0 -- true", "--nnodes", "got '0'");
  expect_refused("launch --node-rank -1 -- true", "--node-rank", "got '-1'");
  expect_refused("launch --timeout nan -- true", "--timeout", "got 'nan'");
  std::string out;
  EXPECT_EQ(run("launch --nproc-per-node 1 -- true", &out), 0) << out;  // the control
}

TEST(CliNumbers, PlanRefusesZeroNegativeAndNanFlags) {
  ASSERT_TRUE(fs::exists(atoll())) << atoll();
  expect_refused("plan --nodes 0", "--nodes", "must be an integer from 1 to");
  expect_refused("plan --islands -3", "--islands", "got '-3'");
  expect_refused("plan --devices-per-node 0", "--devices-per-node", "got '0'");
  expect_refused("plan --tokens -1", "--tokens", "must be a finite number above 0, got '-1'");
  expect_refused("plan --tokens nan", "--tokens", "got 'nan'");
  expect_refused("plan --tokens inf", "--tokens", "got 'inf'");
  expect_refused("plan --tokens 0", "--tokens", "got '0'");
  expect_refused("plan search --batch-tokens 0", "--batch-tokens", "got '0'");
  expect_refused("plan search --top 0", "--top", "got '0'");
  expect_refused("plan sweep --param islands --values 1,nan,4", "--values", "'nan'");
  expect_refused("plan sweep --param islands --values 1,-2", "--values", "'-2'");
  expect_refused("plan sweep --param islands --values 1,2x", "--values", "'2x'");
  // The control: valid values run (3 is the planner's "does not fit in memory" status).
  std::string out;
  int rc = run("plan --nodes 2 --tokens 1e9", &out);
  EXPECT_TRUE(rc == 0 || rc == 3) << rc << "\n" << out;
  EXPECT_EQ(out.find("must be"), std::string::npos) << out;
}

TEST(CliNumbers, TrainRefusesAnEmptyConfigOrADirectory) {
  ASSERT_TRUE(fs::exists(atoll())) << atoll();
  fs::path d = fs::temp_directory_path() / ("atoll_cli_cfg_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d / "adir");
  std::ofstream(d / "empty.toml").close();
  std::string out;
  EXPECT_NE(run("train " + (d / "empty.toml").string() + " --run.dir=" + (d / "run").string(), &out), 0);
  EXPECT_NE(out.find("is empty (it sets no key)"), std::string::npos) << out;
  EXPECT_NE(run("train " + (d / "adir").string() + " --run.dir=" + (d / "run").string(), &out), 0);
  EXPECT_NE(out.find("is a directory, not a TOML file"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(d / "run" / "checkpoints")) << "nothing may have trained";
  fs::remove_all(d);
}

}  // namespace
