// A checkpoint's manifest.json: the step and, for every file of the checkpoint, its size and
// CRC-32C (checkpoint.h). Parsed here in one place, from text, so that every malformed manifest
// is refused with what is wrong in it (and the parser can be fuzzed without a checkpoint).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace atl {

struct ManifestEntry {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

struct CheckpointManifest {
  int64_t step = 0;
  std::map<std::string, ManifestEntry> files;
};

// Parses manifest.json's text; `where` names it in errors. Fails on anything but an object with an
// integer "step" >= 0 and a "files" object of {"bytes": integer >= 0, "crc32c": uint32} entries.
CheckpointManifest parse_checkpoint_manifest(std::string_view text, const std::string& where);

}  // namespace atl
