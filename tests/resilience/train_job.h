// A small `atoll train` job for the trainer-level resilience tests: a generated corpus, a tiny
// GPT config, and `atoll launch` of N ranks with ATOLL_FAILURE_FILE set.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "proc.h"

namespace atl::resilience::test {

inline std::string atoll_exe() { return std::string(ATOLL_BINARY_DIR) + "/atoll"; }

// What differs between the jobs built on it: corpus size, steps, checkpoint and log intervals.
struct TrainJobShape {
  int docs = 120, steps = 24, checkpoint_every = 5, log_every = 8;
};

struct TrainJob {
  std::filesystem::path root;
  explicit TrainJob(const std::string& name, TrainJobShape shape = {}) {
    namespace fs = std::filesystem;
    root = fs::temp_directory_path() / ("atoll_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(root);
    fs::create_directories(root);
    std::ofstream txt(root / "corpus.txt");
    const char* words[] = {"the", "island", "trains", "a", "model", "across", "many", "ranks", "and", "hosts"};
    uint32_t s = 777;
    for (int doc = 0; doc < shape.docs; ++doc) {
      for (int w = 0; w < 40; ++w) {
        s = s * 1664525u + 1013904223u;
        txt << words[(s >> 16) % 10] << (w % 9 == 8 ? ".\n" : " ");
      }
      txt << "\n%\n";
    }
    txt.close();
    pid_t p = spawn({atoll_exe(), "data", "prepare", "--input", (root / "corpus.txt").string(), "--out",
                     (root / "data").string(), "--val-fraction", "0.1"},
                    {}, (root / "prepare.log").string());
    EXPECT_EQ(wait_for(p, 120), 0) << read_file((root / "prepare.log").string());
    std::ofstream c(root / "tiny.toml");
    c << "[data]\ndir = \"" << (root / "data").string() << "\"\nauto_prepare = false\n"
      << "[model]\npreset = \"gpt2-tiny\"\nn_layer = 2\n"
      << "[train]\nsteps = " << shape.steps << "\nbatch_size = 4\nseq_len = 32\nwarmup_steps = 2\nthreads = 1\n"
      << "[optim.adamw]\nlr = 1e-2\n[eval]\nevery = 0\n[sample]\nevery = 0\n[checkpoint]\nevery = "
      << shape.checkpoint_every << "\n[log]\nevery = " << shape.log_every << "\n[hardware]\npeak_gflops = 100.0\n";
  }
  ~TrainJob() {
    if (!std::getenv("ATOLL_KEEP_TEST_FILES")) std::filesystem::remove_all(root);
  }
  // `atoll launch` of `ranks` ranks of `atoll train tiny.toml --run.dir=ROOT/run extra...`; its exit
  // status. A 120 s bound: a step of this model is tens of milliseconds, so only a hang gets near it.
  int launch(int ranks, const std::string& run, const std::vector<std::string>& extra, const std::string& log) {
    return wait_for(start(ranks, {}, run, extra, log), 120);
  }
  // The same, started and not waited for, with options for `atoll launch` itself (before "--").
  // env: variables to set or replace (KEY=VALUE), e.g. another ATOLL_FAILURE_FILE for each node.
  pid_t start(int ranks, const std::vector<std::string>& launch_opts, const std::string& run,
              const std::vector<std::string>& extra, const std::string& log, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {atoll_exe(), "launch", "--nproc-per-node", std::to_string(ranks)};
    argv.insert(argv.end(), launch_opts.begin(), launch_opts.end());
    for (std::string a : {std::string("--"), atoll_exe(), std::string("train"), (root / "tiny.toml").string(),
                          "--run.dir=" + (root / run).string()})
      argv.push_back(a);
    argv.insert(argv.end(), extra.begin(), extra.end());
    std::vector<std::string> vars = env;
    for (std::string v : {std::string("OMP_NUM_THREADS=1"), "ATOLL_FAILURE_FILE=" + (root / "failures.jsonl").string()}) {
      bool set = false;
      for (auto& e : env) set = set || e.compare(0, v.find('=') + 1, v, 0, v.find('=') + 1) == 0;
      if (!set) vars.push_back(v);
    }
    return spawn(argv, vars, (root / log).string());
  }
  std::string log(const std::string& name) const { return read_file((root / name).string()); }
};

// The records of a metrics.jsonl that have `field`.
inline std::vector<nlohmann::json> records_with(const std::filesystem::path& metrics, const std::string& field) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l);
    if (j.contains(field)) out.push_back(j);
  }
  return out;
}

}  // namespace atl::resilience::test
