// CUDA device support (CUDA Runtime API: cudaGetDeviceCount, cudaMalloc/cudaFree, cudaMemcpyAsync
// with unified virtual addressing, cudaMemcpyPeerAsync, cudaStreamCreateWithFlags). The caching
// allocator follows the CPU one (tensor/allocator.cpp): cudaMalloc and cudaFree synchronize the
// device, so a training step must not call them once its working set is cached.
#include "kernels/cuda/device.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace atl::cuda {

std::string error_string(int e) {
  auto err = cudaError_t(e);
  return fmt::format("{}: {}", cudaGetErrorName(err), cudaGetErrorString(err));
}

namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear the sticky-free error state so the next call starts clean
  fail("CUDA {} failed: {}", what, error_string(e));
}

// Same size classes as the CPU allocator: 512 B granularity below 1 MiB (cudaMalloc aligns to 256
// anyway), 1/8 of the power of two above; a cached block serves requests down to half its size.
size_t round_size(size_t n) {
  if (n == 0) n = 1;
  if (n < (1u << 20)) return (n + 511) & ~size_t(511);
  size_t p = 1;
  while (p < n) p <<= 1;
  size_t step = p / 8;
  return (n + step - 1) / step * step;
}

class CudaCachingAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    size_t sz = round_size(nbytes);
    int dev = current_device();
    std::lock_guard<std::mutex> lk(mu_);
    ++st_.allocations;
    auto& fl = free_[dev];
    auto it = fl.lower_bound(sz);
    void* p = nullptr;
    if (it != fl.end() && it->first <= 2 * sz) {
      p = it->second;
      sz = it->first;
      st_.cached_bytes -= sz;
      fl.erase(it);
      ++st_.cache_hits;
    } else {
      cudaError_t e = cudaMalloc(&p, sz);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        release_locked();  // out of memory: give the cache back and try once more
        e = cudaMalloc(&p, sz);
      }
      if (e != cudaSuccess) {
        cudaGetLastError();
        fail("out of CUDA memory on device {} allocating {} bytes ({} in use by tensors): {}", dev,
             sz, st_.current_bytes, error_string(e));
      }
    }
    blocks_[p] = {sz, dev};
    st_.current_bytes += sz;
    if (st_.current_bytes > st_.peak_bytes) st_.peak_bytes = st_.current_bytes;
    return p;
  }
  // Never throws (runs in Storage's destructor). The block goes back to the cache of the device
  // it came from; work still queued on a stream that reads it is the caller's business, as with
  // any caching allocator that does not track streams: we only hand blocks to synchronous users.
  void deallocate(void* p, size_t) override {
    if (!p) return;
    std::lock_guard<std::mutex> lk(mu_);
    auto it = blocks_.find(p);
    if (it == blocks_.end()) return;
    auto [sz, dev] = it->second;
    blocks_.erase(it);
    st_.current_bytes -= sz;
    st_.cached_bytes += sz;
    free_[dev].emplace(sz, p);
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return st_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lk(mu_);
    st_.peak_bytes = st_.current_bytes;
  }
  void release_cache() override {
    std::lock_guard<std::mutex> lk(mu_);
    release_locked();
  }

 private:
  struct Block {
    size_t size;
    int device;
  };
  void release_locked() {
    for (auto& [dev, fl] : free_)
      for (auto& [sz, p] : fl) cudaFree(p);  // frees on the pointer's own device (UVA)
    free_.clear();
    st_.cached_bytes = 0;
  }
  mutable std::mutex mu_;
  std::map<int, std::multimap<size_t, void*>> free_;  // per device: size -> block
  std::map<void*, Block> blocks_;                      // live blocks
  AllocatorStats st_;
};

CudaCachingAllocator& the_allocator() {
  // Never destroyed, like the CPU one: tensors in statics may outlive every other static, and the
  // CUDA runtime may already be torn down at exit, so cached blocks are left to the driver.
  static auto* a = new CudaCachingAllocator();
  return *a;
}

void check_index(int index, const char* what) {
  DeviceQuery q = query_devices();
  ATOLL_CHECK(q.count > 0, "{}: no CUDA device is visible: {}", what, q.reason);
  ATOLL_CHECK(index >= 0 && index < q.count, "{}: CUDA device {} does not exist ({} visible)", what,
              index, q.count);
}

void check_device_side(const Tensor& t, const char* which) {
  ATOLL_CHECK(t.is_contiguous(), "cuda::copy: {} tensor {} on {} is not contiguous", which,
              shape_str(t.shape()), t.device().str());
}

}  // namespace

DeviceQuery query_devices() {
  DeviceQuery q;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    q.reason = error_string(e);
    return q;
  }
  if (n <= 0) {
    q.reason = "the CUDA runtime reports 0 devices";
    return q;
  }
  q.count = n;
  return q;
}

int device_count() { return query_devices().count; }

void set_device(int index) {
  check_index(index, "set_device");
  check(cudaSetDevice(index), "cudaSetDevice");
}

int current_device() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

void init(int index) {
  set_device(index);
  static std::once_flag once;
  std::call_once(once, [] { register_allocator(Device::Kind::cuda, &the_allocator()); });
}

Allocator& device_allocator() { return the_allocator(); }

Stream current_stream() {
  thread_local std::map<int, cudaStream_t> streams;
  int dev = current_device();
  auto it = streams.find(dev);
  if (it != streams.end()) return it->second;
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  streams[dev] = s;
  return s;
}

void synchronize() { check(cudaStreamSynchronize(current_stream()), "cudaStreamSynchronize"); }

// cudaMemcpyDefault lets the runtime infer the direction and the device from the pointers (unified
// virtual addressing), so a copy is right whatever the calling thread's current device is.
void copy(const Tensor& dst, const Tensor& src) {
  ATOLL_CHECK(dst.defined() && src.defined(), "cuda::copy: undefined tensor");
  ATOLL_CHECK(dst.numel() == src.numel(), "cuda::copy: {} elements into {}", src.numel(),
              dst.numel());
  const bool dst_host = dst.device().is_cpu(), src_host = src.device().is_cpu();
  if (dst_host && src_host) {
    Tensor(dst).copy_from(src.reshape(dst.shape()));
    return;
  }
  if (!src_host && !dst_host) {
    check_device_side(dst, "destination");
    check_device_side(src, "source");
    ATOLL_CHECK(dst.dtype() == src.dtype(),
                "cuda::copy: device-to-device copies need equal dtypes (got {} into {})",
                dtype_name(src.dtype()), dtype_name(dst.dtype()));
    Stream s = current_stream();
    if (dst.device().index == src.device().index)
      check(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDefault, s),
            "cudaMemcpyAsync (device to device)");
    else
      check(cudaMemcpyPeerAsync(dst.raw(), dst.device().index, src.raw(), src.device().index,
                                src.nbytes(), s),
            "cudaMemcpyPeerAsync");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize after a device-to-device copy");
    return;
  }
  if (src_host) {  // host -> device: make the host side contiguous and of dst's dtype first
    check_device_side(dst, "destination");
    Tensor h = src;
    if (h.dtype() != dst.dtype())
      h = src.to(dst.dtype());
    else if (!h.is_contiguous())
      h = src.contiguous();
    check(cudaMemcpyAsync(dst.raw(), h.raw(), dst.nbytes(), cudaMemcpyDefault,
                          current_stream()),
          "cudaMemcpyAsync (host to device)");
    synchronize();  // h may be a temporary; the copy must be done before it goes
    return;
  }
  // device -> host: straight into dst when it can take the bytes as they are, else via a buffer.
  check_device_side(src, "source");
  const bool direct = dst.is_contiguous() && dst.dtype() == src.dtype();
  Tensor h = direct ? dst : Tensor::empty(src.shape(), src.dtype());
  check(cudaMemcpyAsync(h.raw(), src.raw(), src.nbytes(), cudaMemcpyDefault,
                        current_stream()),
        "cudaMemcpyAsync (device to host)");
  synchronize();
  if (!direct) Tensor(dst).copy_from(h.reshape(dst.shape()));
}

Tensor to_device(const Tensor& src, Device dev) {
  Tensor out = Tensor::empty(src.shape(), src.dtype(), dev);
  copy(out, src);
  return out;
}

}  // namespace atl::cuda
