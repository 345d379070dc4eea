#include "launch_fixture.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness.h"

namespace fs = std::filesystem;

namespace atl::parallel::test {

std::string atoll_exe() { return std::string(ATOLL_BINARY_DIR) + "/atoll"; }

std::vector<double> metric_values(const fs::path& run, const char* key) {
  std::ifstream f(run / "metrics.jsonl");
  std::vector<double> out;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) {
      auto j = nlohmann::json::parse(line);
      if (j.contains(key)) out.push_back(j[key].get<double>());
    }
  return out;
}

void prepare_word_corpus(const fs::path& root, const std::vector<std::string>& words, uint32_t seed) {
  {
    std::ofstream txt(root / "corpus.txt");
    uint32_t s = seed;
    for (int doc = 0; doc < 200; ++doc) {
      for (int w = 0; w < 40; ++w) {
        s = s * 1664525u + 1013904223u;
        txt << words[(s >> 16) % words.size()] << (w % 9 == 8 ? ".\n" : " ");
      }
      txt << "\n%\n";
    }
  }
  int rc = run_command({atoll_exe(), "data", "prepare", "--input", (root / "corpus.txt").string(), "--out",
                        (root / "data").string(), "--val-fraction", "0.1"},
                       {}, (root / "prepare.log").string(), 60);
  ASSERT_EQ(rc, 0) << read_file((root / "prepare.log").string());
}

LaunchFixture::LaunchFixture(const std::string& tag, const std::string& config_tail, uint32_t seed) {
  root = fs::temp_directory_path() / ("atoll_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  prepare_word_corpus(root, {"the", "island", "trains", "a", "model", "across", "many", "ranks", "and", "hosts"}, seed);
  cfg = root / (tag + ".toml");
  std::ofstream c(cfg);
  c << "[data]\ndir = \"" << (root / "data").string() << "\"\nauto_prepare = false\n" << config_tail;
}

LaunchFixture::~LaunchFixture() {
  const char* keep = std::getenv("ATOLL_KEEP_TEST_DIRS");
  if (!keep || std::string(keep) != "1") fs::remove_all(root);
}

int LaunchFixture::train(const std::string& run, int ranks, std::vector<std::string> extra, bool expect_fail,
                         bool always_launch) {
  std::vector<std::string> argv;
  if (ranks > 1 || always_launch)
    argv = {atoll_exe(), "launch", "--nproc-per-node", std::to_string(ranks), "--timeout", "30", "--"};
  for (auto& a : std::vector<std::string>{atoll_exe(), "train", cfg.string(), "--run.dir=" + (root / run).string()})
    argv.push_back(a);
  for (auto& a : extra) argv.push_back(a);
  int rc = run_command(argv, {}, log_path(run), 120);
  if (rc != 0 && !expect_fail) ADD_FAILURE() << "atoll train (" << run << ") exited " << rc << ":\n" << log(run);
  return rc;
}

std::string LaunchFixture::log_path(const std::string& run) const { return (root / (run + ".log")).string(); }
std::string LaunchFixture::log(const std::string& run) const { return read_file(log_path(run)); }

}  // namespace atl::parallel::test
