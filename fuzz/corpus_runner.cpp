// Runs every fuzz target once over each file of its committed corpus (fuzz/corpus/<target>/),
// without libFuzzer: the unit suite builds this with ASan and UBSan and runs it as a ctest, so a
// parser change that breaks on a known input fails the tests on any compiler. Exit status 1 (with
// the target and file named) on an escaping exception; sanitizer reports abort on their own.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#define ATOLL_FUZZ_TARGETS(X) \
  X(config)                   \
  X(shard_header)             \
  X(safetensors)              \
  X(checkpoint_manifest)      \
  X(bpe_vocab)

#define DECLARE(name) extern "C" int atoll_fuzz_##name(const uint8_t* data, size_t size);
ATOLL_FUZZ_TARGETS(DECLARE)
#undef DECLARE

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT (holding one folder per target)\n", argv[0]);
    return 2;
  }
  struct Target {
    const char* name;
    int (*fn)(const uint8_t*, size_t);
  };
#define ENTRY(name) {#name, atoll_fuzz_##name},
  const Target targets[] = {ATOLL_FUZZ_TARGETS(ENTRY)};
#undef ENTRY
  int failures = 0;
  for (const Target& t : targets) {
    fs::path dir = fs::path(argv[1]) / t.name;
    std::vector<fs::path> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      std::fprintf(stderr, "%s: no corpus files in %s\n", t.name, dir.c_str());
      ++failures;
      continue;
    }
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      try {
        t.fn(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: %s: uncaught exception: %s\n", t.name, f.c_str(), e.what());
        ++failures;
      }
    }
    std::printf("%-20s %zu corpus files\n", t.name, files.size());
  }
  return failures ? 1 : 0;
}
