// Element types and devices. bf16 is stored as the top 16 bits of an IEEE float.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace atl {

enum class DType : uint8_t { f32, bf16, i32, i64 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}
const char* dtype_name(DType t);            // "f32", "bf16", ...
const char* dtype_safetensors_name(DType t);  // "F32", "BF16", ...
DType dtype_from_name(const std::string& name);  // accepts both spellings

struct bf16 {
  uint16_t bits;
};

// Round to nearest even, NaN kept quiet.
inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}
inline float bf16_to_float(bf16 h) {
  uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Device {
  enum class Kind : uint8_t { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;
  static Device cpu() { return {}; }
  static Device cuda(int i = 0) { return {Kind::cuda, i}; }
  bool is_cpu() const { return kind == Kind::cpu; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
  std::string str() const;
};

}  // namespace atl
