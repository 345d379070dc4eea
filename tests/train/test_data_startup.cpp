// What the trainer checks of its data before step 1 (issue 10, list 9 and item 3; issue 9 item 5):
// ids beyond the vocabulary in either split, shards that data.auto_prepare must leave alone, and
// a vocabulary past 65536 ids trained end to end on uint32 shards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/error.h"
#include "data/corpus.h"
#include "data/shards.h"
#include "data/tokenizer_gpt2.h"
#include "train/trainer.h"

using namespace atl;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("atoll_startup_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write_corpus(const fs::path& root) {
  fs::path txt = root / "corpus.txt";
  std::ofstream out(txt);
  for (int doc = 0; doc < 60; ++doc) out << "document " << doc << " says the island trains a model\n%\n";
  return txt.string();
}

Config config(const fs::path& root, const std::string& data, const std::string& extra) {
  return Config::parse(fmt::format(R"(
[run]
dir = "{}"
[data]
dir = "{}"
auto_prepare = false
[model]
preset = "gpt2-tiny"
[train]
steps = 2
batch_size = 2
seq_len = 16
warmup_steps = 0
threads = 2
[eval]
every = 2
steps = 1
[sample]
every = 0
[checkpoint]
every = 0
[log]
every = 100
{}
)",
                                   (root / "run").string(), data, extra),
                       "startup.toml");
}

std::string construction_error(Config& c) {
  try {
    Trainer t(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// An id >= vocab in the validation shard is found when the trainer is built, naming the shard,
// the id and the vocab size; it used to surface only at the first evaluation.
TEST(TrainerStartup, ValidationIdsBeyondTheVocabAreFoundBeforeStep1) {
  fs::path root = scratch("valvocab");
  PrepareOptions po;
  po.inputs = {write_corpus(root)};
  po.out_dir = (root / "data").string();
  po.val_fraction = 0.1;
  prepare_data(po);
  std::vector<int32_t> val(64, 'a');
  val[40] = 300;  // fits a uint16 shard, but not the byte tokenizer's 257 ids
  write_shard(po.out_dir + "/val_000000.bin", val);
  Config c = config(root, po.out_dir, "");
  std::string m = construction_error(c);
  EXPECT_NE(m.find("val_000000.bin holds token id 300"), std::string::npos) << m;
  EXPECT_NE(m.find("vocab size is 257"), std::string::npos) << m;
  fs::remove_all(root);
}

// data.auto_prepare on a directory of the user's shards without meta.json refuses, saying what to
// do, and leaves the files as they were; it used to replace them with the fortunes corpus.
TEST(TrainerStartup, AutoPrepareLeavesShardsItDidNotWriteAlone) {
  if (!fs::is_directory("/usr/share/games/fortunes"))
    GTEST_SKIP() << "Debian's fortunes corpus (scripts/setup.sh installs it) is absent, and "
                    "data.auto_prepare prepares nothing else";
  fs::path root = scratch("autoprep");
  fs::create_directories(root / "mine");
  std::vector<int32_t> toks(5000, 'x');
  write_shard((root / "mine" / "train_000000.bin").string(), toks);
  write_shard((root / "mine" / "val_000000.bin").string(), toks);
  auto size_before = fs::file_size(root / "mine" / "train_000000.bin");
  auto stamp = fs::last_write_time(root / "mine" / "train_000000.bin");
  Config c = config(root, (root / "mine").string(), "");
  c.set_override("data.auto_prepare=true");
  std::string m = construction_error(c);
  EXPECT_NE(m.find("that atoll did not write"), std::string::npos) << m;
  EXPECT_NE(m.find("data.dir"), std::string::npos) << m;
  EXPECT_EQ(fs::file_size(root / "mine" / "train_000000.bin"), size_before);
  EXPECT_EQ(fs::last_write_time(root / "mine" / "train_000000.bin"), stamp);
  EXPECT_TRUE(fs::exists(root / "mine" / "val_000000.bin"));
  EXPECT_FALSE(fs::exists(root / "mine" / "meta.json"));
  fs::remove_all(root);
}

// A tokenizer of 70001 ids: data goes to uint32 shards and the model trains on them.
TEST(TrainerStartup, TrainsAVocabularyPast65536OnUint32Shards) {
  fs::path root = scratch("bigvocab");
  nlohmann::json enc = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) enc[gpt2_spell(std::string(1, char(b)))] = b;
  enc["<|endoftext|>"] = 70000;
  fs::create_directories(root / "tok");
  std::ofstream(root / "tok" / "encoder.json") << enc.dump();
  std::ofstream(root / "tok" / "vocab.bpe") << "#version: 0.2\n";
  PrepareOptions po;
  po.inputs = {write_corpus(root)};
  po.out_dir = (root / "data").string();
  po.tokenizer = (root / "tok").string();
  po.val_fraction = 0.1;
  EXPECT_EQ(prepare_data(po)["token_bytes"], 4);
  Config c = config(root, po.out_dir, "");
  c.set_override("data.tokenizer=\"" + po.tokenizer + "\"");
  c.set_override("model.vocab_size=70001");
  Trainer t(c);
  TrainResult r = t.run(false);
  EXPECT_EQ(r.final_step, 2);
  EXPECT_TRUE(std::isfinite(r.final_loss));
  // Near log(70001) = 11.2 at initialisation: the loss is over all 70001 ids.
  EXPECT_GT(r.final_loss, 9.0);
  fs::remove_all(root);
}
