// The device mesh: the world's ranks as a grid of named axes, each axis a sub-communicator split
// from the world (torchtitan's and PyTorch's DeviceMesh). Axes, outermost first:
//   island        groups trained with infrequent synchronisation (DiLoCo, gossip)
//   pp            pipeline stages
//   dp_replicate  data-parallel replicas (DDP; HSDP's replicas)
//   dp_shard      data-parallel ranks that shard parameters, gradients and optimizer state (ZeRO/FSDP)
//   cp            context (sequence) parallel
//   tp            tensor parallel (innermost, so a tp group stays inside a node)
// and ep (expert parallel), carved out of dp_shard × cp. The order is `atoll plan`'s (tp innermost,
// then cp, dp, pp), its dp being dp_replicate × dp_shard and its hsdp the dp_shard of a mesh that
// also replicates.
//
// Config ([parallel]): dp_replicate, dp_shard, tp, pp, cp, ep, islands. An axis left out is 1,
// except that the data-parallel axis the strategy names takes the ranks the others leave (ddp:
// dp_replicate; zero1/2/3: dp_shard; hsdp: dp_shard = hsdp_shard_size, dp_replicate the rest), so
// the old keys (strategy, hsdp_shard_size) keep their meaning. The product must be WORLD_SIZE.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/config.h"

namespace atl::parallel {

struct MeshShape {
  static constexpr int kAxes = 7;
  // Names in mesh order (outermost first), ep last (it is not a factor of the world).
  static const std::array<const char*, kAxes>& axis_names();
  int64_t island = 1, pp = 1, dp_replicate = 1, dp_shard = 1, cp = 1, tp = 1, ep = 1;

  int64_t& at(const std::string& axis);
  int64_t at(const std::string& axis) const;
  int64_t world() const { return island * pp * dp_replicate * dp_shard * cp * tp; }
  int64_t dp() const { return dp_replicate * dp_shard; }
  // "dp=4 (replicate 2 x shard 2) tp=1 pp=1" in `atoll plan`'s words.
  std::string describe() const;
  // The data-parallel strategy it stands for: ddp, zero1/2/3 or hsdp (stage: 1..3 for pure sharding).
  std::string strategy(int zero_stage) const;

  // Reads [parallel] and resolves the mesh for `world` ranks; `strategy` (ddp, zero1, ..., hsdp;
  // empty when the config names none: then dp_replicate) says which data-parallel axis takes the
  // remaining ranks, hsdp_shard_size (0: local_world)
  // HSDP's shard size. Throws naming the keys and what multiplies to what when they do not fit.
  static MeshShape resolve(Config& cfg, int64_t world, const std::string& strategy, int64_t hsdp_shard_size,
                           int64_t local_world);
};

class Mesh {
 public:
  // world may be null (one process: every axis has size 1).
  Mesh(comm::Communicator* world, MeshShape shape);
  ~Mesh();
  const MeshShape& shape() const { return shape_; }
  // This rank's coordinate along an axis (0 .. size-1).
  int64_t coord(const std::string& axis) const;
  // The ranks that differ from this one only along `axis`; null for one process. Split from the
  // world on first use (a collective over the world: every rank must ask in the same order).
  comm::Communicator* axis(const std::string& axis);
  // The ranks that differ from this one only along the listed axes (the others fixed): e.g. a tp
  // rank's data-parallel group under cp x tp, {dp_replicate, dp_shard, cp}. Null for one process;
  // split on first use like axis().
  comm::Communicator* group(const std::vector<std::string>& axes);

 private:
  comm::Communicator* world_;
  MeshShape shape_;
  std::vector<std::unique_ptr<comm::Communicator>> axes_;
  std::vector<std::pair<std::vector<std::string>, std::unique_ptr<comm::Communicator>>> groups_;
};

}  // namespace atl::parallel
