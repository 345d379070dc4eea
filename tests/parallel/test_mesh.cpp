// The device mesh: [parallel] resolved against the world size (old strategy keys included),
// errors that say what multiplies to what, and on 4 ranks each axis a sub-communicator of the
// ranks that differ only along it, in `atoll plan`'s order (tp innermost).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/config.h"
#include "core/threads.h"
#include "harness.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"

using namespace atl;
using namespace atl::parallel;

namespace {
MeshShape resolve(const std::string& toml, int64_t world, int64_t local_world = 0) {
  Config cfg = Config::parse(toml, "mesh.toml");
  ParallelConfig pc = ParallelConfig::from_config(cfg);
  pc.resolve_mesh(cfg, world, local_world ? local_world : world);
  cfg.finish();
  return pc.mesh;
}
std::string strategy_of(const std::string& toml, int64_t world, int64_t local_world = 0) {
  Config cfg = Config::parse(toml, "mesh.toml");
  ParallelConfig pc = ParallelConfig::from_config(cfg);
  pc.resolve_mesh(cfg, world, local_world ? local_world : world);
  return pc.strategy + "/" + std::to_string(pc.hsdp_shard_size);
}
std::string error_of(const std::string& toml, int64_t world) {
  try {
    resolve(toml, world);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Mesh, OldStrategiesMapOntoTheAxes) {
  MeshShape m = resolve("", 4);
  EXPECT_EQ(m.dp_replicate, 4);
  EXPECT_EQ(m.dp_shard, 1);
  EXPECT_EQ(strategy_of("", 4), "ddp/0");
  m = resolve("[parallel]\nstrategy = \"zero2\"\n", 4);
  EXPECT_EQ(m.dp_shard, 4);
  EXPECT_EQ(m.dp_replicate, 1);
  m = resolve("[parallel]\nstrategy = \"hsdp\"\nhsdp_shard_size = 2\n", 8);
  EXPECT_EQ(m.dp_shard, 2);
  EXPECT_EQ(m.dp_replicate, 4);
  // HSDP without a shard size shards over a node.
  EXPECT_EQ(strategy_of("[parallel]\nstrategy = \"hsdp\"\n", 8, 4), "hsdp/4");
  EXPECT_EQ(m.describe(), "dp=8 (replicate 4 x shard 2) tp=1 pp=1");
}

TEST(Mesh, AxesNameTheStrategy) {
  EXPECT_EQ(strategy_of("[parallel]\ndp_shard = 2\n", 2), "zero3/0");
  EXPECT_EQ(strategy_of("[parallel]\ndp_shard = 2\n", 4), "hsdp/2");  // dp_replicate takes the rest
  EXPECT_EQ(strategy_of("[parallel]\ndp_replicate = 2\n", 4), "hsdp/2");  // dp_shard takes the rest
  EXPECT_EQ(strategy_of("[parallel]\ndp_replicate = 4\n", 4), "ddp/0");
  MeshShape m = resolve("[parallel]\ndp_shard = 2\ntp = 2\n", 8);
  EXPECT_EQ(m.dp_replicate, 2);
  EXPECT_EQ(m.tp, 2);
  EXPECT_EQ(m.describe(), "dp=4 (replicate 2 x shard 2) tp=2 pp=1");
}

// A layout in `atoll plan`'s words (dp, tp, zero, hsdp) runs as the same mesh.
TEST(Mesh, PlanVocabularyMapsOntoTheMesh) {
  EXPECT_EQ(strategy_of("[parallel]\ndp = 4\nzero = 3\n", 4), "zero3/0");
  EXPECT_EQ(strategy_of("[parallel]\nzero = 1\n", 2), "zero1/0");
  EXPECT_EQ(strategy_of("[parallel]\ndp = 8\nzero = 3\nhsdp = 2\n", 8), "hsdp/2");
  EXPECT_EQ(strategy_of("[parallel]\nzero = 0\n", 2), "ddp/0");
  MeshShape m = resolve("[parallel]\ndp = 4\nzero = 3\nhsdp = 2\n", 4);
  EXPECT_EQ(m.dp_shard, 2);
  EXPECT_EQ(m.dp_replicate, 2);
  std::string e = error_of("[parallel]\ndp = 2\n", 4);
  EXPECT_NE(e.find("parallel.dp = 2 (mesh.toml:2), but the mesh has dp_replicate 4 x dp_shard 1 = 4"),
            std::string::npos) << e;
  e = error_of("[parallel]\nstrategy = \"ddp\"\nzero = 2\n", 2);
  EXPECT_NE(e.find("parallel.strategy = 'ddp' contradicts parallel.zero = 2"), std::string::npos) << e;
}

TEST(Mesh, ErrorsSayWhatMultipliesToWhat) {
  std::string e = error_of("[parallel]\ndp_shard = 2\ndp_replicate = 3\n", 4);
  EXPECT_NE(e.find("island 1 x pp 1 x dp_replicate 3 x dp_shard 2 x cp 1 x tp 1 = 6 ranks, but WORLD_SIZE = 4"),
            std::string::npos) << e;
  EXPECT_NE(e.find("parallel.dp_replicate = 3 (mesh.toml:3)"), std::string::npos) << e;
  e = error_of("[parallel]\ntp = 3\n", 4);
  EXPECT_NE(e.find("= 3 ranks does not divide WORLD_SIZE = 4"), std::string::npos) << e;
  e = error_of("[parallel]\nstrategy = \"ddp\"\ndp_shard = 2\n", 2);
  EXPECT_NE(e.find("'ddp' replicates the model, but dp_shard = 2"), std::string::npos) << e;
  e = error_of("[parallel]\nstrategy = \"zero3\"\ndp_replicate = 2\n", 4);
  EXPECT_NE(e.find("use 'hsdp'"), std::string::npos) << e;
  e = error_of("[parallel]\ndp_shard = 2\nep = 4\n", 2);
  EXPECT_NE(e.find("parallel.ep = 4 must divide dp_shard x cp = 2 x 1"), std::string::npos) << e;
}

// A rank of the 4-rank test when ATOLL_MESH_RANK is set; otherwise one process, where every axis
// has size 1 and coordinate 0.
TEST(Mesh, RankProgram) {
  const bool ranked = std::getenv("ATOLL_MESH_RANK") != nullptr;
  std::unique_ptr<comm::Communicator> world;
  MeshShape s;
  if (ranked) {
    set_num_threads(1);
    world = comm::make_communicator("gloo", std::chrono::milliseconds(30000));
    s.dp_replicate = 2;
    s.tp = 2;
  }
  Mesh mesh(world.get(), s);
  int r = world ? world->rank() : 0;
  // Rank r = dp_replicate * 2 + tp (tp innermost).
  EXPECT_EQ(mesh.coord("tp"), r % 2);
  EXPECT_EQ(mesh.coord("dp_replicate"), ranked ? r / 2 : 0);
  if (!ranked) {
    EXPECT_EQ(mesh.axis("tp"), nullptr);
    return;
  }
  for (const char* axis : {"tp", "dp_replicate", "dp_shard"}) {
    comm::Communicator* c = mesh.axis(axis);
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->size(), int(s.at(axis))) << axis;
    EXPECT_EQ(c->rank(), int(mesh.coord(axis))) << axis;
    // The sum of world ranks over the axis: tp pairs {0,1},{2,3}; dp pairs {0,2},{1,3}.
    Tensor t = Tensor::empty({1});
    t.f32()[0] = float(r);
    c->all_reduce(t, comm::ReduceOp::sum);
    float want = std::string(axis) == "tp" ? float(r / 2 * 4 + 1) : std::string(axis) == "dp_replicate" ? float(2 * (r % 2) + 2) : float(r);
    EXPECT_EQ(t.f32()[0], want) << axis << " on rank " << r;
  }
}

TEST(Mesh, FourRanksSplitIntoAxes) {
  std::string tag = (std::filesystem::temp_directory_path() / ("atoll_mesh_" + std::to_string(::getpid()))).string();
  auto codes = test::run_rank_programs(4, "Mesh.RankProgram", {"ATOLL_MESH_RANK=1"}, tag, 60);
  for (size_t r = 0; r < codes.size(); ++r) {
    EXPECT_EQ(codes[r], 0) << "rank " << r << ":\n" << test::read_file(tag + ".log" + std::to_string(r));
    std::filesystem::remove(tag + ".log" + std::to_string(r));
  }
}
