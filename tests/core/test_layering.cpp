// The layer order of the developers' guide, enforced: tools/check_layering.py scans every
// #include under src/ and fails on one that points up (or on a layer above models naming a model
// family). The checker itself must fail on an injected upward include in a scratch tree.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {
struct CheckRun {
  int rc;
  std::string out;
};
CheckRun check(const fs::path& src) {
  std::string cmd = std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR + "/tools/check_layering.py " + src.string() + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  CheckRun r{-1, ""};
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}
void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}
}  // namespace

TEST(Layering, SourceTreeIncludesPointDown) {
  CheckRun r = check(fs::path(ATOLL_SOURCE_DIR) / "src");
  EXPECT_EQ(r.rc, 0) << r.out;
}

TEST(Layering, FailsOnAnInjectedUpwardInclude) {
  fs::path root = fs::temp_directory_path() / ("atoll_layering_" + std::to_string(getpid()));
  fs::remove_all(root);
  write(root / "src/core/a.h", "#pragma once\n");
  write(root / "src/train/trainer.h", "#pragma once\n#include \"core/a.h\"\n");
  write(root / "src/models/gpt/gpt.h", "#pragma once\n");
  write(root / "src/nn/layers.h", "#pragma once\n#include \"core/a.h\"\n");
  CheckRun clean = check(root / "src");
  EXPECT_EQ(clean.rc, 0) << "a tree whose includes point down: " << clean.out;
  // nn including train points up; parallel naming a model family is refused too.
  write(root / "src/nn/layers.h", "#pragma once\n#include \"core/a.h\"\n#include \"train/trainer.h\"\n");
  write(root / "src/parallel/ddp.cpp", "#include \"models/gpt/gpt.h\"\n");
  CheckRun bad = check(root / "src");
  EXPECT_EQ(bad.rc, 1) << bad.out;
  EXPECT_NE(bad.out.find("nn/layers.h:3: includes \"train/trainer.h\": 'train' is not below 'nn'"), std::string::npos)
      << bad.out;
  EXPECT_NE(bad.out.find("parallel/ddp.cpp:1: includes \"models/gpt/gpt.h\": only cli may name a model family"),
            std::string::npos) << bad.out;
  fs::remove_all(root);
}
