// manifest.json parsing (resilience/checkpoint_manifest.h): what CheckpointStore::save writes
// parses back, and damaged manifests are refused naming the field, never with a JSON exception.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fileio.h"
#include "resilience/checkpoint.h"
#include "resilience/checkpoint_manifest.h"

using namespace atl;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::string& text) {
  try {
    parse_checkpoint_manifest(text, "ck/step_1");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(CheckpointManifest, ParsesWhatSaveWrites) {
  fs::path d = fs::temp_directory_path() / ("atoll_manifest_" + std::to_string(::getpid()));
  fs::remove_all(d);
  Checkpoint ck;
  ck.model.emplace_back("w", Tensor::zeros({2, 3}, DType::f32));
  ck.state = {{"step", 7}};
  std::string dir = CheckpointStore(d.string(), 2).save(7, ck);
  CheckpointManifest m = parse_checkpoint_manifest(read_file(dir + "/manifest.json"), dir);
  EXPECT_EQ(m.step, 7);
  ASSERT_EQ(m.files.size(), 3u);
  std::string model = read_file(dir + "/model.safetensors");
  EXPECT_EQ(m.files.at("model.safetensors").bytes, model.size());
  EXPECT_EQ(m.files.at("model.safetensors").crc32c, crc32c(model));
  fs::remove_all(d);
}

TEST(CheckpointManifest, DamageIsNamed) {
  EXPECT_NE(error_of("{\"step\": 1, \"files\": ").find("not JSON"), std::string::npos);
  EXPECT_NE(error_of("[1, 2]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of("{\"files\": {}}").find("\"step\" is missing"), std::string::npos);
  EXPECT_NE(error_of("{\"step\": -3, \"files\": {}}").find("\"step\""), std::string::npos);
  EXPECT_NE(error_of("{\"step\": 1, \"files\": []}").find("\"files\""), std::string::npos);
  EXPECT_NE(error_of("{\"step\": 1, \"files\": {\"a\": 5}}").find("entry of 'a'"), std::string::npos);
  EXPECT_NE(error_of("{\"step\": 1, \"files\": {\"a\": {\"bytes\": -1, \"crc32c\": 1}}}").find("'a' has no integer \"bytes\""),
            std::string::npos);
  EXPECT_NE(error_of("{\"step\": 1, \"files\": {\"a\": {\"bytes\": 1, \"crc32c\": 4294967296}}}").find("32-bit"),
            std::string::npos);
  EXPECT_NE(error_of("{\"step\": 1, \"files\": {\"a\": {\"bytes\": 1, \"crc32c\": \"x\"}}}").find("ck/step_1"),
            std::string::npos);
  EXPECT_EQ(error_of("{\"step\": 1, \"files\": {\"a\": {\"bytes\": 0, \"crc32c\": 4294967295}}}"), "(no error)");
}

// verify() goes through the same parser: a saved checkpoint whose manifest has a wrong-typed
// entry is refused with an atoll error naming the checkpoint (it used to escape as a JSON type
// error from the inline parse).
TEST(CheckpointManifest, VerifyRefusesAWrongTypedManifestWithAMessage) {
  fs::path d = fs::temp_directory_path() / ("atoll_manifest_verify_" + std::to_string(::getpid()));
  fs::remove_all(d);
  Checkpoint ck;
  ck.model.emplace_back("w", Tensor::zeros({2, 3}, DType::f32));
  ck.state = {{"step", 3}};
  std::string dir = CheckpointStore(d.string(), 2).save(3, ck);
  EXPECT_NO_THROW(CheckpointStore::verify(dir));
  std::string text = read_file(dir + "/manifest.json");
  size_t at = text.find("\"bytes\"");
  ASSERT_NE(at, std::string::npos);
  size_t colon = text.find(':', at), end = text.find_first_of(",}", colon);
  write_file_atomic(dir + "/manifest.json", text.substr(0, colon + 1) + " \"many\"" + text.substr(end));
  std::string what;
  try {
    CheckpointStore::verify(dir);
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find(dir), std::string::npos) << "not refused with a message naming the checkpoint: '" << what << "'";
  fs::remove_all(d);
}
