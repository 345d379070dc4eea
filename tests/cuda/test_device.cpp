// CUDA device layer: discovery without a GPU, the caching allocator, copies in every direction.
// Where no GPU is visible the device tests skip and say why; discovery itself runs everywhere.
#ifdef ATOLL_HAVE_CUDA
#include <gtest/gtest.h>

#include "kernels/cuda/device.h"

using namespace atl;

namespace {
// Skips the calling test, saying why, when this process sees no CUDA device.
#define REQUIRE_CUDA_DEVICE()                                                           \
  do {                                                                                  \
    auto q_ = cuda::query_devices();                                                    \
    if (q_.count == 0) GTEST_SKIP() << "no CUDA device visible: " << q_.reason;         \
    cuda::init(0);                                                                      \
  } while (0)

Tensor ramp(int64_t n, float scale) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * float(i % 97) - 3.0f;
  return Tensor::from_vector(v, {n});
}
}  // namespace

TEST(CudaDevice, QueryNeverThrowsAndExplainsAbsence) {
  cuda::DeviceQuery q;
  ASSERT_NO_THROW(q = cuda::query_devices());
  EXPECT_GE(q.count, 0);
  EXPECT_EQ(cuda::device_count(), q.count);
  if (q.count == 0) {
    EXPECT_FALSE(q.reason.empty()) << "no device and no reason";
    // A CUDA runtime error name, e.g. cudaErrorNoDevice or cudaErrorInsufficientDriver.
    EXPECT_NE(q.reason.find("cuda"), std::string::npos) << q.reason;
    try {
      cuda::init(0);
      ADD_FAILURE() << "cuda::init(0) succeeded without a device";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device is visible"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_TRUE(q.reason.empty()) << q.reason;
    EXPECT_THROW(cuda::set_device(q.count), Error);  // one past the last device
  }
}

TEST(CudaAllocator, ReusesFreedBlocksAndCounts) {
  REQUIRE_CUDA_DEVICE();
  Allocator& a = allocator_for(Device::cuda(0));
  EXPECT_EQ(&a, &cuda::device_allocator());
  a.release_cache();
  AllocatorStats s0 = a.stats();
  void* p = a.allocate(100000);
  ASSERT_NE(p, nullptr);
  AllocatorStats s1 = a.stats();
  EXPECT_EQ(s1.allocations, s0.allocations + 1);
  EXPECT_EQ(s1.cache_hits, s0.cache_hits);
  EXPECT_GE(s1.current_bytes, s0.current_bytes + 100000);
  a.deallocate(p, 100000);
  EXPECT_GE(a.stats().cached_bytes, 100000u);
  void* q = a.allocate(90000);  // within 1.25x of the rounded request: served from the cache
  EXPECT_EQ(q, p);
  AllocatorStats s2 = a.stats();
  EXPECT_EQ(s2.cache_hits, s0.cache_hits + 1);
  EXPECT_GE(s2.peak_bytes, s2.current_bytes);
  a.deallocate(q, 90000);
  a.release_cache();
  EXPECT_EQ(a.stats().cached_bytes, 0u);
  EXPECT_EQ(a.stats().current_bytes, s0.current_bytes);
}

TEST(CudaCopy, HostDeviceRoundTrips) {
  REQUIRE_CUDA_DEVICE();
  Tensor h = ramp(5000, 0.5f);
  Tensor d = cuda::to_device(h, Device::cuda(0));
  EXPECT_EQ(d.device(), Device::cuda(0));
  Tensor d2 = Tensor::empty({5000}, DType::f32, Device::cuda(0));
  cuda::copy(d2, d);  // device to device
  Tensor back = Tensor::zeros({5000});
  cuda::copy(back, d2);
  EXPECT_EQ(max_abs_diff(back, h), 0.0);

  // Strided host source and destination, and f32 -> bf16 -> f32 through the device.
  Tensor m = ramp(12, 1.0f).view({3, 4});
  Tensor dm = Tensor::empty({4, 3}, DType::bf16, Device::cuda(0));
  cuda::copy(dm, m.transpose(0, 1));
  Tensor out = Tensor::zeros({3, 4});
  cuda::copy(out.transpose(0, 1), dm);
  EXPECT_EQ(max_abs_diff(out, m), 0.0);  // small integers: exact in bf16

  // Device-to-device needs equal dtypes (converting on the device needs a kernel).
  EXPECT_THROW(cuda::copy(Tensor::empty({12}, DType::f32, Device::cuda(0)), dm), Error);
}
#else
#include <gtest/gtest.h>
TEST(CudaDevice, BuiltWithoutCuda) {
  GTEST_SKIP() << "atoll was built without the CUDA toolkit; the CUDA device layer is absent";
}
#endif
