// How data parallelism cuts the model's flat buffers: parameter spans, gradient buckets and each
// rank's shard of a bucket. Buckets follow the reverse of declaration order, which is the order
// gradients become final in backward (PyTorch DDP's bucketing, Li et al., "PyTorch Distributed:
// Experiences on Accelerating Data Parallel Training", VLDB 2020). A bucket is split into `shards`
// equal chunks (the last padded), chunk r belonging to shard rank r (ZeRO, Rajbhandari et al.,
// "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", SC 2020).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "nn/model.h"

namespace atl::parallel {

struct Span {
  int64_t lo = 0, hi = 0;  // elements of the flat buffers
  int64_t size() const { return hi - lo; }
};

struct BucketLayout {
  Span range;
  std::vector<int> params;  // indices of the parameters overlapping it
  int64_t chunk = 0;        // ceil(size / shards)
  Span own;                 // this shard rank's part (may be empty)
  bool padded() const { return chunk * shards != range.size(); }
  int shards = 1;
};

struct FlatLayout {
  std::vector<nn::Parameter*> params;
  std::vector<Span> spans;  // per parameter
  int64_t numel = 0;
  std::vector<BucketLayout> buckets;
  std::vector<std::vector<int>> buckets_of_param;
};

// Buckets of at least cap_elems elements (whole modules, grouped from offset 0 up, the remainder
// left to the top bucket, which is reduced first), listed in reverse parameter order; with
// shards > 1 each bucket's size is rounded up to a multiple of shards (so only the bucket at
// offset 0 needs padding).
FlatLayout size_buckets(nn::Model& model, int64_t cap_elems, int shards, int shard_rank);
// One bucket per FSDP unit: each of the model's blocks (nn::Model::blocks), and the parameters
// outside the blocks (embeddings below them; final norm and untied head above) as up to two
// "root" buckets.
// Returns the bucket index of each block in block_bucket, the root buckets in root_buckets.
FlatLayout unit_buckets(nn::Model& model, int shards, int shard_rank, std::vector<int>& block_bucket,
                        std::vector<int>& root_buckets);

}  // namespace atl::parallel
