// Pushing a model's weights from one rank to others (the trainer to rollout workers after each
// update): the parameters are packed in order into flat buckets of about bucket_mb each and every
// bucket is one broadcast, queued asynchronously so that packing the next overlaps sending the
// previous; never one message per parameter (a small model has hundreds of tensors, each message
// pays a latency). Receivers unpack into their own tensors of the same shapes.
#pragma once
#include <vector>

#include "comm/communicator.h"
#include "tensor/tensor.h"

namespace atl::rl {

struct SyncStats {
  double seconds = 0;
  int64_t bytes = 0, buckets = 0;
};

class WeightSync {
 public:
  // tensors: the same shapes, in the same order, on every rank; contiguous f32.
  WeightSync(std::vector<Tensor> tensors, double bucket_mb = 4.0);
  // Collective over comm: every rank's tensors become root's, bit for bit.
  SyncStats broadcast(comm::Communicator& comm, int root);
  // The same packing into another set of tensors in this process (a rollout model's copy).
  SyncStats copy_to(const std::vector<Tensor>& dst) const;
  int64_t buckets() const { return int64_t(ranges_.size()); }

 private:
  struct Range {
    size_t first, last;  // tensors [first, last)
    int64_t floats;
  };
  std::vector<Tensor> t_;
  std::vector<Range> ranges_;
  std::vector<Tensor> bufs_;  // one per bucket, allocated once: fresh pages per push cost more than the copy
};

}  // namespace atl::rl
