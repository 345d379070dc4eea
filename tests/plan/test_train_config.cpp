// `atoll plan --emit-train-config`: the layout as the [parallel] table of an atoll train config in
// the mesh vocabulary (dp_replicate, dp_shard, tp, pp, cp, ep), or today's trainer keys.
#include <gtest/gtest.h>

#include "core/config.h"
#include "core/error.h"
#include "plan/train_config.h"

using namespace atl;
using namespace atl::plan;

namespace {
Cluster h100(int64_t nodes) { return make_cluster(find_device("h100-sxm"), 8, nodes, 1); }
}  // namespace

TEST(PlanTrainConfig, MeshKeysMultiplyToTheWorld) {
  ModelSpec m = model_preset("llama3-8b");
  Layout l;
  l.tp = 2, l.pp = 2, l.dp = 8, l.zero = 3, l.hsdp = 4, l.micro_batch = 2, l.global_batch = 64;
  Cluster c = h100(4);
  Config cfg = Config::parse(train_config_toml(m, c, l, "mesh"), "emitted.toml");
  int64_t r = cfg.get_int("parallel.dp_replicate", 0), s = cfg.get_int("parallel.dp_shard", 0);
  int64_t tp = cfg.get_int("parallel.tp", 0), pp = cfg.get_int("parallel.pp", 0), cp = cfg.get_int("parallel.cp", 0);
  EXPECT_EQ(cfg.get_int("parallel.ep", 0), 1);
  EXPECT_EQ(s, 4);  // the HSDP shard group
  EXPECT_EQ(r, 2);  // replicated across 8 / 4 groups
  EXPECT_EQ(r * s * tp * pp * cp, c.world());
  EXPECT_EQ(cfg.get_int("train.batch_size", 0), 2);
  EXPECT_EQ(cfg.get_int("train.grad_accum", 0), 64 / (8 * 2));
  EXPECT_EQ(cfg.get_int("train.seq_len", 0), m.seq);
  EXPECT_EQ(cfg.get_string("train.dtype", ""), "bf16");
  EXPECT_EQ(cfg.get_string("optim.type", ""), "adamw");
  EXPECT_NO_THROW(cfg.finish());  // nothing else was written
}

TEST(PlanTrainConfig, DegreesFollowTheZeroStage) {
  Layout l;
  l.dp = 16;
  MeshDegrees ddp = mesh_degrees(l);
  EXPECT_EQ(ddp.dp_replicate, 16);
  EXPECT_EQ(ddp.dp_shard, 1);
  EXPECT_EQ(ddp.strategy, "ddp");
  l.zero = 3;
  MeshDegrees fsdp = mesh_degrees(l);
  EXPECT_EQ(fsdp.dp_replicate, 1);
  EXPECT_EQ(fsdp.dp_shard, 16);
  EXPECT_EQ(fsdp.strategy, "zero3");
  l.zero = 1;
  EXPECT_EQ(mesh_degrees(l).strategy, "zero1");
}

TEST(PlanTrainConfig, LegacyKeysAreTodaysTrainerOnly) {
  ModelSpec m = model_preset("gpt2-124m");
  Layout l;
  l.dp = 8, l.zero = 3, l.hsdp = 4, l.global_batch = 16;
  Config cfg = Config::parse(train_config_toml(m, h100(1), l, "legacy"), "emitted.toml");
  // The values today's parallel::ParallelConfig::from_config accepts.
  EXPECT_EQ(cfg.get_string("parallel.strategy", "", {"ddp", "zero1", "zero2", "zero3", "hsdp"}), "hsdp");
  EXPECT_EQ(cfg.get_int("parallel.hsdp_shard_size", 0), 4);
  EXPECT_FALSE(cfg.has("parallel.tp"));
  cfg.get_int("train.batch_size", 0), cfg.get_int("train.seq_len", 0), cfg.get_int("train.grad_accum", 0);
  cfg.get_string("train.dtype", ""), cfg.get_string("optim.type", "");
  EXPECT_NO_THROW(cfg.finish());
  // Model parallelism cannot be written for today's trainer: the error names the degree.
  l = Layout{};
  l.dp = 4, l.tp = 2;
  try {
    train_config_toml(m, h100(1), l, "legacy");
    FAIL() << "tp = 2 accepted for the legacy keys";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tp = 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(train_config_toml(m, h100(1), l, "yaml"), Error);
}
