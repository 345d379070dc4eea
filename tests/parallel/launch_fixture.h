// The launch tests' shared fixture (test_launch_train, test_tensor_parallel_launch, test_islands):
// a temporary root holding a small synthetic corpus prepared by `atoll data prepare`, a tiny
// training config, and `atoll train` runs against it (under `atoll launch` for several ranks)
// with command-line overrides, each in its own run dir with its own log.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace atl::parallel::test {

std::string atoll_exe();

// A corpus of 200 documents of 40 words drawn from `words` by an LCG from `seed` (a sentence every
// 9 words), written to root/corpus.txt and prepared by `atoll data prepare` into root/data.
void prepare_word_corpus(const std::filesystem::path& root, const std::vector<std::string>& words, uint32_t seed);

// Command-line overrides a, then b.
inline std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The value of `key` on every metrics.jsonl line that has it, in order (segment lines have none).
std::vector<double> metric_values(const std::filesystem::path& run, const char* key = "loss");

struct LaunchFixture {
  std::filesystem::path root, cfg;
  // tag: the temporary directory's name; config_tail: the config's TOML after its [data] table
  // ([model], [train], ...); seed: the corpus's word sequence. ATOLL_KEEP_TEST_DIRS=1 keeps root.
  LaunchFixture(const std::string& tag, const std::string& config_tail, uint32_t seed = 777);
  ~LaunchFixture();
  // Returns the exit status; a failure is reported unless `expect_fail`. One rank runs `atoll
  // train` directly unless `always_launch`.
  int train(const std::string& run, int ranks, std::vector<std::string> extra, bool expect_fail = false,
            bool always_launch = false);
  std::string log_path(const std::string& run) const;
  std::string log(const std::string& run) const;
  // The run's checkpoint directory of `step` (the trainer's step_%08d naming).
  std::filesystem::path ckpt(const std::string& run, int step) const {
    char b[32];
    std::snprintf(b, sizeof b, "step_%08d", step);
    return root / run / "checkpoints" / b;
  }
};

}  // namespace atl::parallel::test
