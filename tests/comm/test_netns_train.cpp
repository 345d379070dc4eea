// Issue 3's multi-host acceptance check: `atoll launch --nnodes 2` across two network-namespace
// hosts (scripts/netns_testbed.sh, one rank each, rate-limited veth links) runs `atoll train` on
// a tiny config, and its loss curve matches one rank on one host at the same global batch (the
// rank-aware loader gives rank r of W rows r, r+W, ... and gradients are averaged). Both hosts
// share this machine's file system, so they get the same run dir; only rank 0 writes metrics.
// Skipped, with the script's reason, where namespaces cannot be created.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "comm_test_util.h"

using namespace atl::comm::test;
namespace fs = std::filesystem;

namespace {

std::vector<double> curve(const fs::path& run, const char* key) {
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

std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST(NetnsTestbed, TwoHostTrainingMatchesOneHost) {
  fs::path root = fs::temp_directory_path() / ("atoll_netns_train_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  {
    std::ofstream txt(root / "corpus.txt");
    const char* words[] = {"two", "hosts", "train", "one", "model", "over", "a", "slow", "link", "together"};
    uint32_t s = 4242;
    for (int doc = 0; doc < 200; ++doc) {
      for (int w = 0; w < 40; ++w) {
        s = s * 1664525u + 1013904223u;
        txt << words[(s >> 16) % 10] << (w % 9 == 8 ? ".\n" : " ");
      }
      txt << "\n%\n";
    }
  }
  Proc prep = run({atoll_exe(), "data", "prepare", "--input", (root / "corpus.txt").string(), "--out",
                   (root / "data").string(), "--val-fraction", "0.1"},
                  60);
  ASSERT_EQ(prep.exit_code(), 0) << prep.out;
  fs::path cfg = root / "tiny.toml";
  {
    std::ofstream c(cfg);
    c << "[data]\ndir = \"" << (root / "data").string() << "\"\nauto_prepare = false\n"
      << "[model]\npreset = \"gpt2-tiny\"\nn_layer = 2\n"
      << "[train]\nsteps = 5\nbatch_size = 4\nseq_len = 32\nwarmup_steps = 2\nthreads = 1\n"
      << "[optim.adamw]\nlr = 1e-2\n[eval]\nevery = 5\nsteps = 2\n[sample]\nevery = 0\n[checkpoint]\nevery = 0\n"
      << "[log]\nevery = 1\n[hardware]\npeak_gflops = 100.0\n";
  }
  // The reference: one rank on one host at the global batch (2 ranks x 4 rows).
  Proc one = run({atoll_exe(), "train", cfg.string(), "--run.dir=" + (root / "one").string(), "--train.batch_size=8"},
                 60);
  ASSERT_EQ(one.exit_code(), 0) << one.out;

  std::string cmd = fmt::format(
      "'{}' launch --nnodes $NHOSTS --node-rank $HOST_INDEX --nproc-per-node 1 --rdzv $HOST0_ADDR:29400 "
      "--timeout 30 -- '{}' train '{}' --run.dir='{}'",
      atoll_exe(), atoll_exe(), cfg.string(), (root / "two").string());
  Proc p = run({std::string(ATOLL_SOURCE_DIR) + "/scripts/netns_testbed.sh", "--hosts", "2", "--rate", "1gbit", "--",
                cmd},
               90);
  if (p.exit_code() == 77) {
    fs::remove_all(root);
    GTEST_SKIP() << p.out;
  }
  EXPECT_FALSE(p.timed_out) << p.out;
  ASSERT_EQ(p.exit_code(), 0) << p.out;
  EXPECT_NE(p.out.find("netns_testbed: 2 hosts on"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("data parallel: ddp over 2 ranks"), std::string::npos) << p.out;

  for (const char* key : {"loss", "val_loss"}) {
    auto a = curve(root / "two", key), b = curve(root / "one", key);
    ASSERT_FALSE(b.empty()) << key << "\n" << slurp(root / "one" / "metrics.jsonl");
    ASSERT_EQ(a.size(), b.size()) << key << "\n" << p.out;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(a[i], b[i], 1e-4 * std::abs(b[i])) << key << " at entry " << i;
      std::printf("%s[%zu]: 2 hosts %.6f, 1 host %.6f\n", key, i, a[i], b[i]);
    }
  }
  auto loss = curve(root / "one", "loss");
  EXPECT_LT(loss.back(), loss.front()) << "the loss must fall";
  fs::remove_all(root);
}
