// CUDA device support (CUDA Runtime API: cudaGetDeviceCount, cudaMalloc/cudaFree, cudaMemcpyAsync
// with unified virtual addressing, cudaMemcpyPeerAsync, cudaStreamCreateWithFlags). The caching
// allocator is the CPU one's core (tensor/allocator.h) over cudaMalloc: cudaMalloc and cudaFree
// synchronize the device, so a training step must not call them once its working set is cached.
#include "kernels/cuda/device.h"

#include <cuda_runtime_api.h>

#include <map>
#include <mutex>

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

// The caching itself is the CPU allocator's (CachingAllocator, tensor/allocator.h); the device
// supplies cudaMalloc/cudaFree, one cache per device, and 512 B granularity below 1 MiB
// (cudaMalloc aligns to 256 anyway). Streams are not tracked: a freed block is reused at once, so
// work still queued that reads it is the caller's business (blocks go to synchronous users only).
thread_local cudaError_t t_last_malloc_error = cudaSuccess;  // for the out-of-memory message

void* device_alloc(size_t n) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, n);
  if (e == cudaSuccess) return p;
  cudaGetLastError();  // clear the error state so that the retry starts clean
  t_last_malloc_error = e;
  return nullptr;
}
void device_free(void* p) { cudaFree(p); }  // frees on the pointer's own device (UVA)
int device_pool() { return current_device(); }
[[noreturn]] void device_oom(size_t n, int dev, size_t in_use) {
  fail("out of CUDA memory on device {} allocating {} bytes ({} in use by tensors): {}", dev, n,
       in_use, error_string(t_last_malloc_error));
}

CachingAllocator& the_allocator() {
  // Never destroyed, like the CPU one: tensors in statics may outlive every other static, and the
  // CUDA runtime may already be torn down at exit, so cached blocks are left to the driver.
  static auto* a = new CachingAllocator({device_alloc, device_free, device_pool, device_oom, 512});
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
