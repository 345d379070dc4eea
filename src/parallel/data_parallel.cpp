#include "parallel/data_parallel.h"

#include <cmath>

#include "parallel/ddp.h"
#include "parallel/zero.h"

namespace atl::parallel {

ParallelConfig ParallelConfig::from_config(Config& cfg) {
  ParallelConfig pc;
  pc.strategy = cfg.get_string("parallel.strategy", pc.strategy, {"ddp", "zero1", "zero2", "zero3", "hsdp"});
  pc.bucket_mb = cfg.get_float("parallel.bucket_mb", pc.bucket_mb, 1e-4, 1e5);
  pc.hsdp_shard_size = int(cfg.get_int("parallel.hsdp_shard_size", pc.hsdp_shard_size, 0, 1 << 20));
  return pc;
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

std::unique_ptr<DataParallel> make_data_parallel(nn::GPT& model, comm::Communicator* comm,
                                                 const ParallelConfig& pc, const AdamWConfig& ac,
                                                 std::unique_ptr<Optimizer> opt, const ShardedOptimizerFactory& sharded) {
  int64_t cap = std::max<int64_t>(1, int64_t(pc.bucket_mb * 1024.0 * 1024.0 / 4.0));
  if (pc.strategy == "ddp") return std::make_unique<DDP>(model, comm, cap, ac, std::move(opt));
  ATOLL_CHECK(!opt,
              "parallel.strategy = '{}' shards its optimizer over the flat buffers and cannot take optimizer '{}' "
              "built for the whole model; use parallel.strategy = 'ddp', or [optim] type = 'muon' or 'prmuon' "
              "with AdamW on embeddings, head and vectors (sharded by ZeRO)",
              pc.strategy, opt->name());
  if (pc.strategy == "zero1") return std::make_unique<Zero>(model, comm, 1, cap, 0, ac, sharded);
  if (pc.strategy == "zero2") return std::make_unique<Zero>(model, comm, 2, cap, 0, ac, sharded);
  if (pc.strategy == "zero3") return std::make_unique<Zero>(model, comm, 3, cap, 0, ac, sharded);
  if (pc.strategy == "hsdp") {
    int world = comm ? comm->size() : 1;
    int s = pc.hsdp_shard_size > 0 ? pc.hsdp_shard_size : comm::DistEnv::from_environment().local_world_size;
    ATOLL_CHECK(s >= 1 && world % s == 0,
                "parallel.hsdp_shard_size = {} must divide the number of ranks ({})", s, world);
    return std::make_unique<Zero>(model, comm, 3, cap, s, ac, sharded);
  }
  fail("unknown parallel.strategy '{}'; use ddp, zero1, zero2, zero3 or hsdp", pc.strategy);
}

}  // namespace atl::parallel
