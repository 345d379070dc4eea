#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>

#include "tensor/allocator.h"
#include "tensor/rng.h"
#include "tensor/safetensors.h"

using namespace atl;

TEST(Tensor, ViewsShareStorageAndIndexCorrectly) {
  std::vector<float> v(24);
  for (int i = 0; i < 24; ++i) v[size_t(i)] = float(i);
  Tensor t = Tensor::from_vector(v, {2, 3, 4});
  Tensor tr = t.transpose(1, 2);  // [2,4,3]
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.at({1, 2, 1}), t.at({1, 1, 2}));
  Tensor s = t.slice(2, 1, 3);  // [2,3,2]
  EXPECT_EQ(s.at({1, 2, 0}), 21.f);
  EXPECT_TRUE(s.same_storage(t));
  Tensor c = tr.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.at({1, 2, 1}), tr.at({1, 2, 1}));
  Tensor r = t.reshape({6, 4});
  EXPECT_TRUE(r.same_storage(t));
  EXPECT_EQ(t.view({-1, 12}).size(0), 2);
  EXPECT_THROW(t.view({5, 5}), Error);
  EXPECT_THROW(tr.view({24}), Error);
  EXPECT_EQ(t.select(0, 1).at({0, 0}), 12.f);
}

TEST(Tensor, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.00390625f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.01171875f)), 1.015625f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  Tensor t = Tensor::from_vector({0.1f, -2.5f, 3.3f}, {3});
  Tensor back = t.to(DType::bf16).to(DType::f32);
  EXPECT_LT(max_abs_diff(back, t), 0.02);
}

TEST(Allocator, ReusesBlocksAndTracksPeak) {
  Allocator& a = allocator_for(Device::cpu());
  a.reset_peak();
  auto before = a.stats();
  { Tensor t = Tensor::empty({1 << 20}); }
  { Tensor t = Tensor::empty({1 << 20}); }
  auto after = a.stats();
  EXPECT_GE(after.cache_hits, before.cache_hits + 1);
  EXPECT_GE(after.peak_bytes, before.current_bytes + (size_t(4) << 20));
  EXPECT_EQ(after.current_bytes, before.current_bytes);
}

TEST(Rng, StreamsAreIndependentAndStateRestores) {
  Rng a(42, 0), b(42, 1), c(42, 0);
  int same = 0;
  for (int i = 0; i < 100; ++i) same += a.next_u64() == b.next_u64();
  EXPECT_EQ(same, 0);
  for (int i = 0; i < 100; ++i) c.next_u64();
  auto st = a.state();
  float x = a.normal();
  a.set_state(st);
  EXPECT_EQ(a.normal(), x);
  // Normal samples have about the right moments.
  Rng n(7, 0);
  double s = 0, s2 = 0;
  for (int i = 0; i < 20000; ++i) {
    double v = n.normal();
    s += v;
    s2 += v * v;
  }
  EXPECT_NEAR(s / 20000, 0.0, 0.03);
  EXPECT_NEAR(s2 / 20000, 1.0, 0.05);
}

TEST(Safetensors, RoundTripAndCorruption) {
  Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::from_vector_i32({7, 8}, {2});
  std::string bytes = safetensors_encode({{"a", a}, {"b", b}}, {{"k", "v"}});
  TensorFile f = safetensors_decode(bytes, "mem");
  EXPECT_EQ(f.metadata.at("k"), "v");
  EXPECT_EQ(max_abs_diff(f.get("a"), a), 0.0);
  EXPECT_EQ(f.get("b").i32()[1], 8);
  EXPECT_THROW(f.get("c"), Error);
  EXPECT_THROW(safetensors_decode(bytes.substr(0, bytes.size() - 4), "truncated"), Error);
  EXPECT_THROW(safetensors_decode("xx", "tiny"), Error);
}

// Found by fuzz/fuzz_safetensors.cpp: a file of no tensors was written with the header "null",
// which the safetensors format (a JSON object) and other readers refuse; it is "{}" now, and the
// old "null" still reads. Malformed headers are refused naming the tensor, never with a JSON
// library exception, and shapes are checked against the bytes before anything is allocated.
TEST(Safetensors, EmptyFilesAndMalformedHeaders) {
  std::string empty = safetensors_encode({});
  ASSERT_GE(empty.size(), 10u);
  EXPECT_EQ(empty.substr(8, 2), "{}");
  EXPECT_TRUE(safetensors_decode(empty, "empty").tensors.empty());
  std::string old_null = std::string("\x08\0\0\0\0\0\0\0null    ", 16);
  EXPECT_TRUE(safetensors_decode(old_null, "old").tensors.empty());
  auto file = [](const std::string& header, size_t data_bytes) {
    std::string h = header;
    uint64_t n = h.size();
    return std::string(reinterpret_cast<const char*>(&n), 8) + h + std::string(data_bytes, '\0');
  };
  auto message = [](const std::string& bytes) -> std::string {
    try {
      safetensors_decode(bytes, "m.safetensors");
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_NE(message(file("[1]", 0)).find("not a JSON object"), std::string::npos);
  EXPECT_NE(message(file("{\"t\": 5}", 0)).find("tensor 't': its header entry is not an object"), std::string::npos);
  EXPECT_NE(message(file("{\"t\": {\"dtype\": 1, \"shape\": [], \"data_offsets\": [0, 4]}}", 4)).find("\"dtype\""),
            std::string::npos);
  EXPECT_NE(message(file("{\"t\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", 4)).find("\"shape\""),
            std::string::npos);
  EXPECT_NE(message(file("{\"t\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4)).find("data_offsets"),
            std::string::npos);
  EXPECT_NE(message(file("{\"__metadata__\": {\"k\": 1}}", 0)).find("metadata 'k' is not a string"), std::string::npos);
  // 2^32 x 2^32 elements would overflow 64 bits; found before any allocation.
  EXPECT_NE(message(file("{\"t\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], \"data_offsets\": [0, 4]}}", 4))
                .find("too few for shape"),
            std::string::npos);
  EXPECT_NE(message(file("{\"t\": {\"dtype\": \"F32\", \"shape\": [0, 9223372036854775807, 4], \"data_offsets\": [0, 0]}}", 0))
                .find("too few for shape"),
            std::string::npos);
  TensorFile ok = safetensors_decode(file("{\"t\": {\"dtype\": \"F32\", \"shape\": [0, 7], \"data_offsets\": [0, 0]}}", 0), "z");
  ASSERT_EQ(ok.tensors.size(), 1u);
  EXPECT_EQ(ok.tensors[0].second.numel(), 0);
}
