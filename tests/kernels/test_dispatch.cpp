// The device dispatch point (kernels/dispatch.h): the CPU fp32 table is complete, a backend
// registers its own, and asking for an unregistered (device, dtype) is an error naming both.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/dispatch.h"

using namespace atl;

TEST(KernelDispatch, CpuF32TableHasEveryKernel) {
  const kernels::KernelTable& t = kernels::table(Device::cpu(), DType::f32);
  EXPECT_STREQ(t.name, "cpu/f32");
  // Every member after the name is a function pointer; none may be missing.
  const char* p = reinterpret_cast<const char*>(&t) + sizeof(const char*);
  const size_t n = (sizeof(t) - sizeof(const char*)) / sizeof(void (*)());
  for (size_t i = 0; i < n; ++i) {
    void (*f)();
    std::memcpy(&f, p + i * sizeof f, sizeof f);
    EXPECT_NE(f, nullptr) << "kernel " << i << " of the cpu/f32 table is null";
  }
}

TEST(KernelDispatch, UnregisteredDeviceAndDtypeNameBoth) {
  try {
    kernels::table(Device::cuda(1), DType::bf16);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda:1"), std::string::npos) << m;
    EXPECT_NE(m.find("bf16"), std::string::npos) << m;
    EXPECT_NE(m.find("cpu/f32"), std::string::npos) << m;  // and says what exists
  }
}

TEST(KernelDispatch, ABackendRegistersItsTable) {
  static kernels::KernelTable fake = kernels::table(Device::cpu(), DType::f32);
  fake.name = "cpu/i64 (test)";
  kernels::register_table(Device::Kind::cpu, DType::i64, &fake);
  EXPECT_EQ(&kernels::table(Device::cpu(), DType::i64), &fake);
  kernels::register_table(Device::Kind::cpu, DType::i64, nullptr);
  EXPECT_THROW(kernels::table(Device::cpu(), DType::i64), Error);
}

TEST(KernelDispatch, BroadcastPlanMergesDims) {
  std::vector<int64_t> out;
  kernels::Broadcast bc;
  ASSERT_TRUE(kernels::broadcast_shapes({2, 3, 4}, {4}, &out, &bc));
  EXPECT_EQ(out, (std::vector<int64_t>{2, 3, 4}));
  ASSERT_EQ(bc.ndim, 2);  // [6, 4]: a full everywhere, b only along the last
  EXPECT_EQ(bc.size[0], 6);
  EXPECT_EQ(bc.sa[0], 4);
  EXPECT_EQ(bc.sb[0], 0);
  EXPECT_EQ(bc.sb[1], 1);
  EXPECT_FALSE(kernels::broadcast_shapes({2, 3}, {2}, &out, &bc));
}
