// CUDA device support: device discovery that never throws, a caching device allocator, copies of
// Tensors between host and device, and one stream per host thread. Host code against the CUDA
// runtime API (CUDA Runtime API reference, "Device Management", "Memory Management", "Stream
// Management"); no kernels live here. Built only when the CUDA toolkit is found (ATOLL_HAVE_CUDA).
//
// This header includes no CUDA header, so code above it compiles without the toolkit's include
// directory; guard uses with #ifdef ATOLL_HAVE_CUDA.
#pragma once
#include <string>

#include "tensor/allocator.h"
#include "tensor/tensor.h"

struct CUstream_st;  // the CUDA runtime's opaque stream type (cudaStream_t is CUstream_st*)

namespace atl::cuda {

using Stream = CUstream_st*;

// How many CUDA devices this process can use. Never throws: without a driver, without a GPU, or
// with CUDA_VISIBLE_DEVICES empty, count is 0 and reason says which (the runtime's own words).
struct DeviceQuery {
  int count = 0;
  std::string reason;  // empty when count > 0
};
DeviceQuery query_devices();
int device_count();  // query_devices().count

// Makes `index` the calling thread's current device and registers the CUDA caching allocator for
// Device::Kind::cuda (once per process). Throws atl::Error saying why when the device is absent.
void init(int index = 0);
void set_device(int index);  // the calling thread's current device; throws when absent
int current_device();

// The caching allocator registered by init(). Blocks come from the calling thread's current
// device (Allocator::allocate has no device argument), so allocate CUDA tensors on a thread whose
// current device is the tensor's: Tensor::empty(shape, dt, Device::cuda(i)) after set_device(i).
Allocator& device_allocator();

// Copies src into dst; each may be on the host or on any CUDA device. Shapes must have the same
// number of elements. Host sides may be strided and may differ in dtype (f32 <-> bf16: converted
// on the host); device sides must be contiguous, and device-to-device copies need equal dtypes
// (converting on the device needs a kernel). Returns when the copy is complete.
void copy(const Tensor& dst, const Tensor& src);
// A new contiguous tensor with src's shape and dtype on `dev` (host or device), copied from src.
Tensor to_device(const Tensor& src, Device dev);

// The calling thread's stream on its current device (created on first use, non-blocking with
// respect to the legacy default stream, never destroyed: it lives as long as the thread's
// process). Everything in this file runs on it.
Stream current_stream();
void synchronize();  // waits for the calling thread's stream

// The runtime's message for a CUDA error code, as "cudaErrorNoDevice: no CUDA-capable device ...".
std::string error_string(int cuda_error);

}  // namespace atl::cuda
