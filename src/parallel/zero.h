// ZeRO data parallelism (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion
// Parameter Models", SC 2020) and its FSDP/HSDP forms (Zhao et al., "PyTorch FSDP: Experiences
// on Scaling Fully Sharded Data Parallel", VLDB 2023):
//
//  stage 1: gradients all-reduced as in DDP; each rank updates only its shard with its shard of
//           the optimizer state (ShardedAdamW), then the updated shards are all-gathered;
//  stage 2: gradients reduce-scattered instead, each rank receiving only its shard's sum;
//  stage 3: parameters sharded too. The units are the transformer blocks and the parameters
//           outside them (the "root": embeddings below, final norm and untied head above). A
//           unit is all-gathered just before its use in forward (the next one prefetched) and
//           released after it, gathered again before its backward (the previous one prefetched)
//           and released after: the embeddings around the embedding lookup (their backward needs
//           no weights), final norm and head from the last block's forward to the start of its
//           backward (a tied head keeps the embeddings for that span too). Released memory is
//           returned to the kernel (page_release.h), the per-rank chunks that collectives
//           read and write live only while they are in flight (on Gloo the reduce-scatter works
//           in place, its output being the rank's own range of the gradient buffer), and when a
//           unit's backward ends at most two units' gradients may still wait for their
//           reduce-scatter (backpressure), so a rank holds ~1/N of the parameters, gradients and
//           optimizer state plus the few units in use.
//  HSDP:    stage 3 within groups of hsdp_shard_size ranks, each group a replica; gradient shards
//           are all-reduced across the replicas after the reduce-scatter.
//
// A gradient codec ([parallel] codec, stages 1 and 2; zero_codec.cpp): stage 1's all-reduce and
// stage 2's reduce-scatter go through comm::CompressedAllReducer, decoded and summed in f32, each
// bucket as soon as it is final but synchronously (not overlapped with the rest of backward).
//
// Every bucket is a range of the flat buffers cut into equal per-rank chunks; a reduction starts
// from gradient hooks as soon as its bucket is final, overlapped with the rest of backward.
#pragma once
#include <deque>
#include <functional>

#include "comm/compressed_allreduce.h"

#include "parallel/data_parallel.h"
#include "parallel/flat_layout.h"
#include "parallel/mesh.h"
#include "parallel/optim/sharded_adamw.h"
#include "parallel/optim/sharded_optimizer.h"

namespace atl::parallel {

class Zero final : public DataParallel, private nn::BlockHooks {
 public:
  // hsdp_shard_size > 0: HSDP with groups of that many ranks (stage must be 3).
  // make_opt (optional) builds the rank's sharded optimizer over the layout (sharded_optimizer.h);
  // without it, ShardedAdamW from ac.
  // mesh (optional): under HSDP the shard and replica groups are its dp_shard and dp_replicate
  // axes (else split from comm here, the same groups: consecutive ranks shard).
  Zero(nn::Model& model, comm::Communicator* comm, int stage, int64_t bucket_elems, int hsdp_shard_size,
       const AdamWConfig& ac, const ShardedOptimizerFactory& make_opt = {}, Mesh* mesh = nullptr,
       const comm::CodecSpec& codec = {});
  ~Zero() override;
  std::string name() const override;
  void zero_grad() override;
  void finish_backward() override;
  double grad_norm() override;
  void step(const StepContext& ctx) override;
  void full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                  std::vector<std::pair<std::string, Tensor>>& opt_state) override;
  void load_full_state(const std::vector<std::pair<std::string, Tensor>>& model_sd, const TensorFile& opt_state,
                       const std::string& what) override;
  int stage() const { return stage_; }
  // [lo, hi) ranges of the flat gradient buffer that hold this rank's reduced gradients after
  // finish_backward: its own chunk of every bucket under stages 2 and 3 (the rest is stale), the
  // whole buffer under stage 1 or on one rank.
  std::vector<std::pair<int64_t, int64_t>> reduced_grad_ranges() const;
  std::vector<std::pair<int64_t, int64_t>> value_ranges() const override {
    return stage_ == 3 && shards() > 1 ? reduced_grad_ranges() : std::vector<std::pair<int64_t, int64_t>>{};
  }
  size_t num_buckets() const { return layout_.buckets.size(); }
  // The communicator a bucket is sharded over (HSDP: one replica's group; null on one rank) and
  // its size: sums over the own chunks of every bucket (a gradient norm) run over it.
  comm::Communicator* shard_comm() const { return shard_; }
  int shard_size() const { return shards(); }
  // Stage 3: called with a unit's parameters when their gradients are final, just before the
  // unit's reduce-scatter, on every rank of the data-parallel group at the same point (tp x
  // ZeRO-3 sums tp's partial gradients of the unit there: tensor_parallel_fsdp.cpp). Each
  // parameter belongs to exactly one unit.
  using BeforeReduce = std::function<void(const std::vector<nn::Parameter*>& unit)>;
  void set_before_reduce(BeforeReduce f);
  comm::CompressedAllReducer* gradient_codec() override { return compressor_.get(); }
  std::vector<std::pair<std::string, int64_t>> gradient_codec_tensors() const override;  // zero_codec.cpp

 private:
  struct BucketState {
    int pending = 0;
    bool launched = false;
    bool grads_released = false;  // stage 3: the bucket's full-size gradients are given back
    comm::WorkPtr reduce, gather;
    bool gathered = true;  // stage 3: the whole bucket's values are present
    // Only while a collective is in flight: a buffer holding this rank's
    // chunk (reduce-scatter output / all-gather input) and, for a bucket whose size does not
    // divide, the shards*chunk staging copy. rs_out is where the reduce-scatter writes: rs_buf,
    // or with an in-place reduce-scatter this rank's chunk of the input itself.
    Tensor rs_buf, ag_buf, rs_padded, ag_padded, rs_out;
  };
  int shards() const { return shard_ ? shard_->size() : 1; }
  void on_grad_ready(int param);
  void reap_reduced();
  void reap_gathered();
  void complete_reduce(size_t b);
  Tensor take_scratch(int64_t n);
  void throttle_reduces(size_t max_in_flight);
  void give_scratch(Tensor& t);
  void gather_window(const std::vector<size_t>& bs);
  std::vector<size_t> top_units() const;
  void launch_reduce(size_t b);
  void start_gather(size_t b);
  void finish_gather(size_t b);
  void ensure_gathered(size_t b);
  void release_values(size_t b);
  void gather_all();
  void release_all();
  // nn::BlockHooks (stage 3)
  void forward_begin() override;
  void before_forward(int64_t block) override;
  void after_forward(int64_t block) override;
  void before_backward(int64_t block) override;
  void after_backward(int64_t block) override;

  // zero_codec.cpp: the compressed reduction of bucket b (true), or false without a codec.
  bool reduce_compressed(size_t b, const Tensor& in);
  void setup_codec(const comm::CodecSpec& codec);
  std::unique_ptr<comm::CompressedAllReducer> compressor_;

  int stage_;
  std::unique_ptr<comm::Communicator> shard_owned_, replica_owned_;
  comm::Communicator* shard_ = nullptr;
  comm::Communicator* replica_ = nullptr;  // HSDP's replicas of this shard (null: one replica)
  bool hsdp_ = false;
  FlatLayout layout_;
  std::vector<int> block_bucket_, root_buckets_;
  std::vector<BucketState> st_;
  int bottom_ = -1, top_ = -1;  // stage 3 root buckets: embeddings; final norm and untied head
  bool tied_ = false;
  std::deque<size_t> inflight_;  // buckets whose reduce-scatter is running, oldest first
  bool in_place_rs_ = false;     // the shard communicator reduce-scatters and all-gathers in place (Gloo)
  ShardedOptimizer* sopt_ = nullptr;
  BeforeReduce before_reduce_;
};

}  // namespace atl::parallel
