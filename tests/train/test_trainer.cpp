// The training loop end to end on a small generated corpus: bit-exact resume, divergence
// handling, corrupt checkpoints, and config errors.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/fileio.h"
#include "resilience/checkpoint.h"
#include "data/corpus.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

using namespace atl;
namespace fs = std::filesystem;

using namespace atl::test;

TEST(Trainer, ResumeIsBitExact) {
  fs::path a = scratch("resume_a"), b = scratch("resume_b");
  std::string data = make_data(a);
  std::vector<float> straight, resumed;
  double loss_straight, loss_resumed;
  {
    Config c = tiny_config(a, data, 8);
    Trainer t(c);
    auto r = t.run(false);
    EXPECT_EQ(r.final_step, 8);
    loss_straight = r.final_loss;
    straight = weights_of(t);
  }
  {
    Config c = tiny_config(b, data, 8);
    c.set_override("train.stop_after=4");
    Trainer t(c);
    EXPECT_EQ(t.run(false).final_step, 4);
  }
  {
    Config c = tiny_config(b, data, 8);
    Trainer t(c);
    auto r = t.run(true);
    EXPECT_EQ(r.final_step, 8);
    loss_resumed = r.final_loss;
    resumed = weights_of(t);
  }
  EXPECT_EQ(loss_straight, loss_resumed);
  ASSERT_EQ(straight.size(), resumed.size());
  EXPECT_EQ(std::memcmp(straight.data(), resumed.data(), straight.size() * sizeof(float)), 0)
      << "weights differ after resuming";
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST(Trainer, LossGoesDown) {
  fs::path a = scratch("learn");
  std::string data = make_data(a);
  Config c = tiny_config(a, data, 30);
  Trainer t(c);
  auto r = t.run(false);
  EXPECT_LT(r.final_val_loss, 0.75 * std::log(257.0)) << "the model did not learn";
  EXPECT_TRUE(fs::exists(a / "run" / "metrics.jsonl"));
  fs::remove_all(a);
}

TEST(Trainer, DivergenceStopsAndKeepsLastCheckpoint) {
  fs::path a = scratch("nan");
  std::string data = make_data(a);
  {
    Config c = tiny_config(a, data, 4);
    Trainer t(c);
    t.run(false);
  }
  std::string before = read_file((a / "run" / "checkpoints" / "step_00000004" / "model.safetensors").string());
  Config c = tiny_config(a, data, 40);
  c.set_override("fault.nan_at_step=6");
  Trainer t(c);
  try {
    t.run(true);
    FAIL() << "a diverging run did not stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("diverged at step 6"), std::string::npos) << e.what();
  }
  std::string after = read_file((a / "run" / "checkpoints" / "step_00000004" / "model.safetensors").string());
  EXPECT_EQ(before, after);
  CheckpointStore store((a / "run" / "checkpoints").string());
  EXPECT_EQ(fs::path(*store.latest()).filename(), "step_00000004");
  fs::remove_all(a);
}

TEST(Trainer, CorruptCheckpointIsRefusedAndKept) {
  fs::path a = scratch("corrupt");
  std::string data = make_data(a);
  {
    Config c = tiny_config(a, data, 4);
    Trainer t(c);
    t.run(false);
  }
  fs::path f = a / "run" / "checkpoints" / "step_00000004" / "model.safetensors";
  std::string bytes = read_file(f.string());
  bytes[bytes.size() / 2] ^= 0x40;
  { std::ofstream(f, std::ios::binary) << bytes; }
  Config c = tiny_config(a, data, 8);
  Trainer t(c);
  try {
    t.run(true);
    FAIL() << "a corrupt checkpoint was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_file(f.string()), bytes) << "the corrupt checkpoint was overwritten";
  // Truncation is caught as well.
  { std::ofstream(f, std::ios::binary) << bytes.substr(0, bytes.size() / 3); }
  EXPECT_THROW(CheckpointStore::verify(f.parent_path().string()), Error);
  fs::remove_all(a);
}

TEST(Trainer, UnknownConfigKeyIsNamed) {
  fs::path a = scratch("badkey");
  Config c = tiny_config(a, "unused", 4);
  c.set_override("train.learning_rate=0.1");
  try {
    Trainer t(c);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("train.learning_rate"), std::string::npos) << m;
    EXPECT_NE(m.find("did you mean"), std::string::npos) << m;
  }
  fs::remove_all(a);
}

TEST(Trainer, MuonThroughTheOptimizerFactoryTrainsAndResumes) {
  fs::path a = scratch("muon_a"), b = scratch("muon_b");
  std::string data = make_data(a);
  auto muon = [&](const fs::path& root, int64_t steps) {
    Config c = tiny_config(root, data, steps);
    c.set_override("optim.type=muon");
    c.set_override("optim.muon.lr=0.02");
    return c;
  };
  std::vector<float> straight, resumed;
  {
    Config c = muon(a, 6);
    Trainer t(c);
    auto r = t.run(false);
    EXPECT_LT(r.final_val_loss, std::log(257.0));
    straight = weights_of(t);
  }
  {
    Config c = muon(b, 6);
    c.set_override("train.stop_after=4");
    Trainer t(c);
    t.run(false);
  }
  {
    Config c = muon(b, 6);
    Trainer t(c);
    t.run(true);
    resumed = weights_of(t);
  }
  EXPECT_EQ(std::memcmp(straight.data(), resumed.data(), straight.size() * sizeof(float)), 0);
  // An unknown key of the optimizer's own section is caught like any other.
  Config bad = muon(a, 6);
  bad.set_override("optim.muon.momentun=0.9");
  EXPECT_THROW({ Trainer t(bad); }, Error);
  fs::remove_all(a);
  fs::remove_all(b);
}
