// manifest.json parsing: every field's type and range checked, so that a damaged manifest gives
// an error naming the field instead of a JSON library exception.
#include "resilience/checkpoint_manifest.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace atl {

CheckpointManifest parse_checkpoint_manifest(std::string_view text, const std::string& where) {
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: manifest.json is corrupt (not JSON: {})", where, e.what());
  }
  ATOLL_CHECK(m.is_object(), "{}: manifest.json is corrupt (not a JSON object)", where);
  CheckpointManifest out;
  auto step = m.find("step");
  ATOLL_CHECK(step != m.end() && step->is_number_integer() && step->get<int64_t>() >= 0,
              "{}: manifest.json is corrupt (\"step\" is missing or not an integer >= 0)", where);
  out.step = step->get<int64_t>();
  auto files = m.find("files");
  ATOLL_CHECK(files != m.end() && files->is_object(),
              "{}: manifest.json is corrupt (\"files\" is missing or not an object)", where);
  for (const auto& [name, e] : files->items()) {
    ATOLL_CHECK(e.is_object(), "{}: manifest.json is corrupt (the entry of '{}' is not an object)",
                where, name);
    auto bytes = e.find("bytes"), crc = e.find("crc32c");
    // Sizes and checksums are written unsigned; a negative or fractional one is damage.
    ATOLL_CHECK(bytes != e.end() && bytes->is_number_unsigned(),
                "{}: manifest.json is corrupt ('{}' has no integer \"bytes\" >= 0)", where, name);
    ATOLL_CHECK(crc != e.end() && crc->is_number_unsigned() &&
                    crc->get<uint64_t>() <= UINT32_MAX,
                "{}: manifest.json is corrupt ('{}' has no 32-bit \"crc32c\")", where, name);
    out.files[name] = {bytes->get<uint64_t>(), uint32_t(crc->get<uint64_t>())};
  }
  return out;
}

}  // namespace atl
