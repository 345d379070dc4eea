// Fuzz target: a checkpoint's manifest.json (resilience/checkpoint_manifest).
#include <string_view>

#include "core/error.h"
#include "fuzz/fuzz_target.h"
#include "resilience/checkpoint_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    atl::CheckpointManifest m = atl::parse_checkpoint_manifest(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz/manifest.json");
    ATOLL_FUZZ_ASSERT(m.step >= 0);
  } catch (const atl::Error&) {
  }
  return 0;
}
