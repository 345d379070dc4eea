#include "tensor/dtype.h"

#include "core/error.h"

namespace atl {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
  }
  return "?";
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  if (n == "f32" || n == "F32" || n == "float32" || n == "fp32") return DType::f32;
  if (n == "bf16" || n == "BF16" || n == "bfloat16") return DType::bf16;
  if (n == "i32" || n == "I32" || n == "int32") return DType::i32;
  if (n == "i64" || n == "I64" || n == "int64") return DType::i64;
  fail("unknown dtype '{}' (known: f32, bf16, i32, i64)", n);
}

std::string Device::str() const {
  return kind == Kind::cpu ? std::string("cpu") : "cuda:" + std::to_string(index);
}

}  // namespace atl
