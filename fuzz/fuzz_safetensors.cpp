// Fuzz target: safetensors files (tensor/safetensors: the 8-byte length, the JSON header, the
// byte ranges). A decoded file must re-encode and decode to the same names, shapes and bytes.
#include <cstring>
#include <string>

#include "core/error.h"
#include "fuzz/fuzz_target.h"
#include "tensor/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  atl::TensorFile f;
  try {
    f = atl::safetensors_decode(bytes, "fuzz.safetensors");
  } catch (const atl::Error&) {
    return 0;
  }
  size_t total = 0;
  for (const auto& [name, t] : f.tensors) total += t.nbytes();
  ATOLL_FUZZ_ASSERT(total <= size);
  atl::TensorFile g = atl::safetensors_decode(atl::safetensors_encode(f.tensors, f.metadata), "re-encoded");
  ATOLL_FUZZ_ASSERT(g.tensors.size() == f.tensors.size());
  ATOLL_FUZZ_ASSERT(g.metadata == f.metadata);
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    const atl::Tensor &a = f.tensors[i].second, &b = g.tensors[i].second;
    ATOLL_FUZZ_ASSERT(g.tensors[i].first == f.tensors[i].first);
    ATOLL_FUZZ_ASSERT(a.shape() == b.shape() && a.dtype() == b.dtype() && a.nbytes() == b.nbytes());
    ATOLL_FUZZ_ASSERT(a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
  }
  return 0;
}
