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
CheckRun check(const fs::path& src, const std::string& cmake = "") {
  std::string cmd = std::string(ATOLL_PYTHON) + " " + ATOLL_SOURCE_DIR + "/tools/check_layering.py " + src.string() +
                    (cmake.empty() ? "" : " --cmake " + cmake) + " 2>&1";
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

// Every include points down, and each layer library links the layers its files include.
TEST(Layering, SourceTreeIncludesPointDown) {
  CheckRun r = check(fs::path(ATOLL_SOURCE_DIR) / "src", std::string(ATOLL_SOURCE_DIR) + "/CMakeLists.txt");
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
  write(root / "src/optim/groups.cpp", "// GPT-2's recipe (a comment may cite it)\nbool head(const char* n) { return n == \"lm_head\"; }\n");
  CheckRun bad = check(root / "src");
  EXPECT_EQ(bad.rc, 1) << bad.out;
  EXPECT_NE(bad.out.find("nn/layers.h:3: includes \"train/trainer.h\": 'train' is not below 'nn'"), std::string::npos)
      << bad.out;
  EXPECT_NE(bad.out.find("parallel/ddp.cpp:1: includes \"models/gpt/gpt.h\": only cli may name a model family"),
            std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("optim/groups.cpp:2: names the GPT family (\"lm_head)"), std::string::npos) << bad.out;
  EXPECT_EQ(bad.out.find("optim/groups.cpp:1"), std::string::npos) << "comments may cite GPT-2: " << bad.out;
  fs::remove_all(root);
}

// A layer library linking a layer its files do not include, or missing one they do, is refused.
TEST(Layering, FailsOnALinkTheLayerDoesNotUse) {
  fs::path root = fs::temp_directory_path() / ("atoll_layering_cmake_" + std::to_string(getpid()));
  fs::remove_all(root);
  write(root / "src/core/a.cpp", "#include \"core/a.h\"\n");
  write(root / "src/core/a.h", "#pragma once\n");
  write(root / "src/tensor/t.cpp", "#include \"core/a.h\"\n");
  write(root / "src/nn/n.cpp", "#include \"tensor/t.h\"\n");
  write(root / "good.txt", "atoll_layer(core core fmt::fmt)\natoll_layer(tensor tensor atoll_core)\n"
                           "atoll_layer(nn nn atoll_tensor)\n");
  CheckRun good = check(root / "src", (root / "good.txt").string());
  EXPECT_EQ(good.rc, 0) << good.out;
  write(root / "bad.txt", "atoll_layer(core core fmt::fmt)\natoll_layer(tensor tensor atoll_core)\n"
                          "atoll_layer(nn nn atoll_core atoll_tensor)\natoll_layer(autograd autograd atoll_nn)\n");
  write(root / "src/autograd/g.cpp", "#include \"tensor/t.h\"\n");
  write(root / "src/nn/n.cpp", "#include \"core/a.h\"\n");
  CheckRun bad = check(root / "src", (root / "bad.txt").string());
  EXPECT_EQ(bad.rc, 1) << bad.out;
  EXPECT_NE(bad.out.find("atoll_nn links atoll_tensor, which no file of src/nn includes"), std::string::npos)
      << bad.out;
  fs::remove_all(root);
}
