// What the trainer tests share: a scratch directory, a small prepared corpus, a tiny config, and
// running the `atoll` command as a user would.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/corpus.h"
#include "train/trainer.h"

namespace atl::test {

namespace fs = std::filesystem;

inline fs::path scratch(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("atoll_trainer_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A small corpus of pseudo-sentences, prepared once per test directory.
inline std::string make_data(const fs::path& root) {
  fs::path txt = root / "corpus.txt";
  std::ofstream out(txt);
  const char* words[] = {"the", "island", "trains", "a", "model", "across", "many", "ranks", "and", "hosts"};
  uint32_t s = 12345;
  for (int doc = 0; doc < 300; ++doc) {
    for (int w = 0; w < 40; ++w) {
      s = s * 1664525u + 1013904223u;
      out << words[(s >> 16) % 10] << (w % 9 == 8 ? ".\n" : " ");
    }
    out << "\n%\n";
  }
  out.close();
  PrepareOptions po;
  po.inputs = {txt.string()};
  po.out_dir = (root / "data").string();
  po.val_fraction = 0.1;
  prepare_data(po);
  return po.out_dir;
}

inline std::string tiny_config_text(const fs::path& root, const std::string& data, int64_t steps) {
  return fmt::format(R"(
[run]
dir = "{}"
[data]
dir = "{}"
auto_prepare = false
[model]
preset = "gpt2-tiny"
[train]
steps = {}
batch_size = 4
seq_len = 32
grad_accum = 2
warmup_steps = 2
threads = 2
[optim.adamw]
lr = 1e-2
[eval]
every = 4
steps = 2
[sample]
every = 0
[checkpoint]
every = 4
[log]
every = 100
[hardware]
peak_gflops = 100.0
)",
                     (root / "run").string(), data, steps);
}

inline Config tiny_config(const fs::path& root, const std::string& data, int64_t steps) {
  return Config::parse(tiny_config_text(root, data, steps), "tiny.toml");
}

inline std::vector<float> weights_of(Trainer& t) { return t.model().flat_values().to_vector(); }

struct CmdResult {
  int status = -1;  // raw wait status
  std::string out;  // stdout and stderr
  double seconds = 0;
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }
};

// Runs a shell command line, capturing stdout and stderr together.
inline CmdResult run_shell(const std::string& cmd) {
  CmdResult r;
  auto t0 = std::chrono::steady_clock::now();
  FILE* p = ::popen(("exec 2>&1; " + cmd).c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  r.status = ::pclose(p);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

inline std::string atoll_exe() { return std::string(ATOLL_BINARY_DIR) + "/atoll"; }

inline bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

}  // namespace atl::test
