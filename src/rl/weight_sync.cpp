#include "rl/weight_sync.h"

#include <chrono>
#include <cstring>

#include "core/error.h"

namespace atl::rl {

WeightSync::WeightSync(std::vector<Tensor> tensors, double bucket_mb) : t_(std::move(tensors)) {
  ATOLL_CHECK(bucket_mb > 0, "weight sync: bucket size must be positive, got {} MB", bucket_mb);
  const int64_t cap = std::max<int64_t>(1, int64_t(bucket_mb * 1024 * 1024 / 4));
  Range cur{0, 0, 0};
  for (size_t i = 0; i < t_.size(); ++i) {
    ATOLL_CHECK(t_[i].dtype() == DType::f32 && t_[i].is_contiguous(), "weight sync: tensor {} is not contiguous f32", i);
    if (cur.floats > 0 && cur.floats + t_[i].numel() > cap) {
      ranges_.push_back(cur);
      cur = {i, i, 0};
    }
    cur.last = i + 1;
    cur.floats += t_[i].numel();
  }
  if (cur.last > cur.first) ranges_.push_back(cur);
  for (const Range& r : ranges_) bufs_.push_back(Tensor::zeros({r.floats}));
}

SyncStats WeightSync::broadcast(comm::Communicator& comm, int root) {
  auto t0 = std::chrono::steady_clock::now();
  SyncStats st;
  const bool src = comm.rank() == root;
  std::vector<comm::WorkPtr> work;
  for (size_t k = 0; k < ranges_.size(); ++k) {
    const Range& r = ranges_[k];
    Tensor& b = bufs_[k];
    if (src) {
      int64_t off = 0;
      for (size_t i = r.first; i < r.last; ++i) {
        std::memcpy(b.f32() + off, t_[i].f32(), size_t(t_[i].numel()) * 4);
        off += t_[i].numel();
      }
    }
    work.push_back(comm.broadcast_async(b, root));
    st.bytes += r.floats * 4;
  }
  for (size_t k = 0; k < ranges_.size(); ++k) {
    work[k]->wait();
    if (src) continue;
    int64_t off = 0;
    for (size_t i = ranges_[k].first; i < ranges_[k].last; ++i) {
      std::memcpy(t_[i].f32(), bufs_[k].f32() + off, size_t(t_[i].numel()) * 4);
      off += t_[i].numel();
    }
  }
  st.buckets = int64_t(ranges_.size());
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

SyncStats WeightSync::copy_to(const std::vector<Tensor>& dst) const {
  ATOLL_CHECK(dst.size() == t_.size(), "weight sync: {} destination tensors for {}", dst.size(), t_.size());
  auto t0 = std::chrono::steady_clock::now();
  SyncStats st;
  for (size_t i = 0; i < t_.size(); ++i) {
    ATOLL_CHECK(dst[i].numel() == t_[i].numel() && dst[i].dtype() == DType::f32 && dst[i].is_contiguous(),
                "weight sync: destination tensor {} does not match the source", i);
    std::memcpy(dst[i].f32(), t_[i].f32(), size_t(t_[i].numel()) * 4);
    st.bytes += t_[i].numel() * 4;
  }
  st.buckets = int64_t(ranges_.size());
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace atl::rl
