#include "parallel/data_parallel.h"

#include <fmt/format.h>

#include <cmath>

#include "parallel/ddp.h"
#include "parallel/zero.h"

namespace atl::parallel {

ParallelConfig ParallelConfig::from_config(Config& cfg) {
  ParallelConfig pc;
  pc.strategy_set = cfg.has("parallel.strategy");
  pc.strategy = cfg.get_string("parallel.strategy", pc.strategy, strategy_registry().names());
  pc.bucket_mb = cfg.get_float("parallel.bucket_mb", pc.bucket_mb, 1e-4, 1e5);
  pc.hsdp_shard_size = int(cfg.get_int("parallel.hsdp_shard_size", pc.hsdp_shard_size, 0, 1 << 20));
  pc.codec = comm::CodecSpec::from_config(cfg, "parallel");
  pc.scape_sparsity = cfg.get_float("parallel.scape_sparsity", pc.scape_sparsity, 0.0, 0.9999);
  pc.scape_lazy = cfg.get_string("parallel.scape_update", "lazy", {"lazy", "dense"}) == "lazy";
  pc.coded_stragglers = int(cfg.get_int("parallel.coded_stragglers", pc.coded_stragglers, 1, 1 << 16));
  pc.coded_delay_rank = int(cfg.get_int("parallel.coded_delay_rank", pc.coded_delay_rank, -1, 1 << 20));
  pc.coded_delay_ms = cfg.get_float("parallel.coded_delay_ms", pc.coded_delay_ms, 0.0, 3.6e6);
  // `atoll plan`'s words for the same thing: zero = 0..3 (0: DDP), hsdp = shard size.
  if (cfg.has("parallel.zero") || cfg.has("parallel.hsdp")) {
    int zero = int(cfg.get_int("parallel.zero", 0, 0, 3));
    int hsdp = int(cfg.get_int("parallel.hsdp", 0, 0, 1 << 20));
    std::string s = hsdp > 0 ? "hsdp" : zero > 0 ? "zero" + std::to_string(zero) : "ddp";
    ATOLL_CHECK(!pc.strategy_set || pc.strategy == s, "parallel.strategy = '{}' contradicts parallel.zero = {}{} ({})",
                pc.strategy, zero, hsdp > 0 ? fmt::format(", parallel.hsdp = {}", hsdp) : "", s);
    ATOLL_CHECK(hsdp == 0 || zero == 0 || zero == 3, "parallel.hsdp = {} shards parameters: it needs zero = 3, not {}",
                hsdp, zero);
    ATOLL_CHECK(hsdp == 0 || pc.hsdp_shard_size == 0 || pc.hsdp_shard_size == hsdp,
                "parallel.hsdp = {} and parallel.hsdp_shard_size = {} disagree", hsdp, pc.hsdp_shard_size);
    pc.strategy = s;
    pc.strategy_set = true;
    if (hsdp > 0) pc.hsdp_shard_size = hsdp;
  }
  return pc;
}

void ParallelConfig::resolve_mesh(Config& cfg, int64_t world, int64_t local_world) {
  mesh = MeshShape::resolve(cfg, world, strategy_set ? strategy : "", hsdp_shard_size, local_world);
  if (cfg.has("parallel.dp")) {  // `atoll plan`'s data-parallel degree: replicas x shards
    int64_t dp = cfg.get_int("parallel.dp", 1, 1, 1 << 20);
    ATOLL_CHECK(mesh.dp() == dp, "parallel.dp = {} ({}), but the mesh has dp_replicate {} x dp_shard {} = {}", dp,
                cfg.where("parallel.dp"), mesh.dp_replicate, mesh.dp_shard, mesh.dp());
  }
  if (!strategy_set) strategy = mesh.strategy(3);
  if (strategy == "hsdp") hsdp_shard_size = int(mesh.dp_shard);
}

void check_mesh_supported(const MeshShape& m, const nn::Model& model) {
  // ep x cp x HSDP: ep is carved out of dp_shard x cp, the group HSDP shards over (tested:
  // MoEContextParallel.Ep2TimesCp2UnderHsdpOnEightRanksFollowsOneProcess).
  nn::ParallelPlan plan = model.parallelize();
  struct Need {
    const char* axis;
    int64_t size;
    nn::ParallelStyle style;
    const char* what;
  };
  for (const Need& n : {Need{"tp", m.tp, nn::ParallelStyle::colwise, "tensor parallelism"},
                        Need{"ep", m.ep, nn::ParallelStyle::expert, "expert parallelism"},
                        Need{"cp", m.cp, nn::ParallelStyle::sequence, "context parallelism"}}) {
    if (n.size == 1) continue;
    ATOLL_CHECK(plan.covers(n.style), "parallel.{} = {}: model family '{}' plans no {} (its parallelize() has no {} "
                "modules)", n.axis, n.size, model.family(), n.what, nn::parallel_style_name(n.style));
    // context_parallel.cpp; its gradients reduce with dp's (HSDP: shards over dp_shard x cp, zero.h).
    // cp x tp: ring attention over each tp rank's heads (docs/context_parallel.md).
    if (n.style == nn::ParallelStyle::sequence) continue;
    if (std::string(n.axis) == "tp") continue;  // parallel/tensor_parallel.h
    if (n.style == nn::ParallelStyle::expert) continue;  // expert_parallel.h (the trainer injects its dispatcher)
    fail("parallel.{} = {}: {} is planned by model family '{}' but not implemented by this build's strategies yet",
         n.axis, n.size, n.what, model.family());
  }
  // parallel.pp > 1 runs as a pipeline (parallel/pipeline.h), which checks its own layout.
  // pp x cp (x tp): every stage's blocks run ring attention over the stage's cp group (pipeline.h).
  // Islands (m.island > 1) are trained by src/lowcomm over island sub-communicators, with data,
  // context and tensor parallelism inside each island (lowcomm/tensor_parallel_islands.cpp,
  // sharded_islands.cpp) and pipelines of ddp/zero1/zero2 stages, with tp or cp inside them
  // (lowcomm/pipeline_islands.cpp), which
  // refuses the layouts it does not compose with pp, naming their keys.
}

DataParallel::~DataParallel() = default;

int DataParallel::join(bool has_data) {
  if (!comm_) return active_ = has_data ? 1 : 0;
  Tensor t = Tensor::empty({1}, DType::i32);
  *t.i32() = has_data ? 1 : 0;
  comm_->all_reduce(t, comm::ReduceOp::sum);
  return active_ = *t.i32();
}

double DataParallel::average(double x) {
  if (!comm_ || comm_->size() == 1) return x;
  // A double as two floats (high part and remainder) keeps the sum accurate to ~1e-14.
  Tensor t = Tensor::empty({2});
  t.f32()[0] = float(x);
  t.f32()[1] = float(x - double(t.f32()[0]));
  comm_->all_reduce(t, comm::ReduceOp::sum);
  return (double(t.f32()[0]) + double(t.f32()[1])) / double(comm_->size());
}

float DataParallel::take_grad_divisor() {
  int n = active_ < 0 ? world() : active_;
  active_ = -1;
  return n > 0 ? 1.f / float(n) : 0.f;
}

namespace {
std::unique_ptr<DataParallel> make_zero(int stage, nn::Model& model, comm::Communicator* comm, const ParallelConfig& pc,
                                        const AdamWConfig& ac, const ShardedOptimizerFactory& sharded) {
  int64_t cap = std::max<int64_t>(1, int64_t(pc.bucket_mb * 1024.0 * 1024.0 / 4.0));
  return std::make_unique<Zero>(model, comm, stage, cap, 0, ac, sharded, nullptr, pc.codec);
}
}  // namespace

Registry<StrategyEntry>& strategy_registry() {
  static Registry<StrategyEntry> r = [] {
    Registry<StrategyEntry> g("parallel strategy");
    g.add("ddp", {false, [](nn::Model& model, comm::Communicator* comm, const ParallelConfig& pc, const AdamWConfig& ac,
                            std::unique_ptr<Optimizer> opt, const ShardedOptimizerFactory&, Mesh*) -> std::unique_ptr<DataParallel> {
                    int64_t cap = std::max<int64_t>(1, int64_t(pc.bucket_mb * 1024.0 * 1024.0 / 4.0));
                    return std::make_unique<DDP>(model, comm, cap, ac, std::move(opt), pc.codec);
                  }});
    for (int stage : {1, 2, 3})
      g.add("zero" + std::to_string(stage),
            {true, [stage](nn::Model& model, comm::Communicator* comm, const ParallelConfig& pc, const AdamWConfig& ac,
                           std::unique_ptr<Optimizer>, const ShardedOptimizerFactory& sharded, Mesh*) {
               return make_zero(stage, model, comm, pc, ac, sharded);
             }});
    g.add("hsdp", {true, [](nn::Model& model, comm::Communicator* comm, const ParallelConfig& pc, const AdamWConfig& ac,
                            std::unique_ptr<Optimizer>, const ShardedOptimizerFactory& sharded, Mesh* mesh) -> std::unique_ptr<DataParallel> {
                     int world = comm ? comm->size() : 1;
                     int s = pc.hsdp_shard_size > 0 ? pc.hsdp_shard_size
                                                    : comm::DistEnv::from_environment().local_world_size;
                     ATOLL_CHECK(s >= 1 && world % s == 0,
                                 "parallel.hsdp_shard_size = {} must divide the number of ranks ({})", s, world);
                     int64_t cap = std::max<int64_t>(1, int64_t(pc.bucket_mb * 1024.0 * 1024.0 / 4.0));
                     return std::make_unique<Zero>(model, comm, 3, cap, s, ac, sharded, mesh);
                   }});
    return g;
  }();
  return r;
}

std::unique_ptr<DataParallel> make_data_parallel(nn::Model& model, comm::Communicator* comm,
                                                 const ParallelConfig& pc, const AdamWConfig& ac,
                                                 std::unique_ptr<Optimizer> opt, const ShardedOptimizerFactory& sharded,
                                                 Mesh* mesh) {
  const StrategyEntry& e = strategy_registry().get(pc.strategy, "parallel.strategy");
  ATOLL_CHECK(!e.sharding || !opt,
              "parallel.strategy = '{}' shards its optimizer over the flat buffers and cannot take optimizer '{}' "
              "built for the whole model; use parallel.strategy = 'ddp', or [optim] type = 'muon' or 'prmuon' "
              "with AdamW on embeddings, head and vectors (sharded by ZeRO)",
              pc.strategy, opt ? opt->name() : "");
  ATOLL_CHECK(pc.codec.none() || pc.strategy == "ddp" || pc.strategy == "zero1" || pc.strategy == "zero2",
              "parallel.codec = '{}'{}: gradient codecs run under parallel.strategy = 'ddp', 'zero1' or 'zero2', "
              "not '{}'", pc.codec.codec,
              pc.codec.where.empty() ? "" : " (" + pc.codec.where + ")", pc.strategy);
  return e.make(model, comm, pc, ac, std::move(opt), sharded, mesh);
}

}  // namespace atl::parallel
