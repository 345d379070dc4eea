// The trainer composes its parts by name from the config: an unknown model family, task,
// optimizer or parallel strategy is an error that names the key and lists the valid names,
// raised before any data is read or prepared.
#include <gtest/gtest.h>

#include <filesystem>

#include "core/config.h"
#include "train/trainer.h"

using namespace atl;
namespace fs = std::filesystem;

namespace {
// A config whose data directory does not exist and must not be prepared: composition errors come
// first.
std::string construct_error(const std::string& extra) {
  fs::path run = fs::temp_directory_path() / ("atoll_composition_" + std::to_string(::getpid()));
  std::string text = "[run]\ndir = \"" + run.string() + "\"\n[data]\ndir = \"" + (run / "no-data").string() +
                     "\"\nauto_prepare = false\n" + extra;
  Config cfg = Config::parse(text, "compose.toml");
  try {
    Trainer t(cfg);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Composition, UnknownModelFamilyListsTheFamilies) {
  std::string e = construct_error("[model]\nfamily = \"gtp\"\n");
  EXPECT_NE(e.find("model.family (compose.toml:"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown model family 'gtp'; valid: gpt"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'gpt'"), std::string::npos) << e;
}

TEST(Composition, UnknownTaskListsTheTasks) {
  std::string e = construct_error("[train]\ntask = \"diffusion\"\n");
  EXPECT_NE(e.find("train.task (compose.toml:"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown task 'diffusion'; valid: lm"), std::string::npos) << e;
}

TEST(Composition, UnknownOptimizerAndStrategyListTheValidOnes) {
  std::string e = construct_error("[model]\npreset = \"gpt2-tiny\"\n[optim]\ntype = \"adagrad\"\n");
  EXPECT_NE(e.find("optim.type"), std::string::npos) << e;
  for (const char* n : {"adamw", "muon", "prmuon", "dion3", "soap", "adams", "lion", "sgd"})
    EXPECT_NE(e.find(n), std::string::npos) << n << " missing from: " << e;
  EXPECT_EQ(e.find("ember"), std::string::npos) << "ember takes no hidden matrices: " << e;
  e = construct_error("[parallel]\nstrategy = \"fsdp2\"\n");
  EXPECT_NE(e.find("parallel.strategy"), std::string::npos) << e;
  for (const char* n : {"ddp", "zero1", "zero2", "zero3", "hsdp"}) EXPECT_NE(e.find(n), std::string::npos) << e;
}

TEST(Composition, MeshMustMultiplyToTheWorld) {
  // One process: dp_shard = 2 asks for two ranks.
  std::string e = construct_error("[parallel]\ndp_shard = 2\n");
  EXPECT_NE(e.find("dp_replicate 1 x dp_shard 2 x cp 1 x tp 1 = 2 ranks does not divide WORLD_SIZE = 1"),
            std::string::npos) << e;
  EXPECT_NE(e.find("parallel.dp_shard = 2 (compose.toml:"), std::string::npos) << e;
}
