#include "resilience/checkpoint.h"

#include <filesystem>
#include <set>

#include "core/checksum.h"
#include "core/fileio.h"
#include "core/log.h"
#include "resilience/checkpoint_manifest.h"
#include "resilience/checkpoint_select.h"

namespace atl {
namespace fs = std::filesystem;

namespace {
const char* kFiles[] = {"model.safetensors", "optimizer.safetensors", "state.json"};

std::string step_name(int64_t step) { return fmt::format("step_{:08d}", step); }
}  // namespace

CheckpointStore::CheckpointStore(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {
  fs::create_directories(dir_);
}

std::string CheckpointStore::save(int64_t step, const Checkpoint& ck) {
  std::string final_dir = (fs::path(dir_) / step_name(step)).string();
  std::string tmp_dir = final_dir + ".tmp";
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  std::map<std::string, std::string> blobs;
  blobs["model.safetensors"] = safetensors_encode(ck.model, ck.model_metadata);
  blobs["optimizer.safetensors"] = safetensors_encode(ck.optimizer);
  blobs["state.json"] = ck.state.dump(2);
  nlohmann::json manifest = {{"step", step}, {"files", nlohmann::json::object()}};
  for (auto& [name, bytes] : blobs) {
    write_file_atomic((fs::path(tmp_dir) / name).string(), bytes);
    manifest["files"][name] = {{"bytes", bytes.size()}, {"crc32c", crc32c(bytes)}};
  }
  write_file_atomic((fs::path(tmp_dir) / "manifest.json").string(), manifest.dump(2));
  // Swap into place; an existing checkpoint of the same step is only removed once the new one is whole.
  std::string old_dir = final_dir + ".old";
  fs::remove_all(old_dir);
  if (fs::exists(final_dir)) fs::rename(final_dir, old_dir);
  fs::rename(tmp_dir, final_dir);
  fs::remove_all(old_dir);
  write_file_atomic((fs::path(dir_) / "latest").string(), step_name(step) + "\n");

  // Retention by step number (names sort wrongly past 8 digits), never touching the checkpoint
  // just written, the one this run resumed from, or any of a higher step than this save (left by
  // an earlier attempt: this run replaces them when it gets there).
  std::vector<CheckpointEntry> older;
  for (auto& e : list_checkpoints(dir_))
    if (e.step <= step) older.push_back(e);
  std::set<int64_t> keep_always = protected_;
  keep_always.insert(step);
  if (certified_ >= 0) keep_always.insert(certified_);
  for (auto& v : retention_victims(older, keep_, keep_always)) fs::remove_all(v.path);
  return final_dir;
}

std::optional<std::string> CheckpointStore::latest() const {
  fs::path p = fs::path(dir_) / "latest";
  if (!fs::exists(p)) return std::nullopt;
  std::string n = read_file(p.string());
  while (!n.empty() && (n.back() == '\n' || n.back() == ' ')) n.pop_back();
  fs::path d = fs::path(dir_) / n;
  if (!fs::exists(d)) return std::nullopt;
  return d.string();
}

void CheckpointStore::verify(const std::string& path) {
  fs::path mp = fs::path(path) / "manifest.json";
  ATOLL_CHECK(fs::exists(mp), "checkpoint '{}' has no manifest.json: incomplete or not a checkpoint", path);
  // The one manifest parser (checkpoint_manifest.h, fuzzed): a malformed manifest is refused with
  // what is wrong in it, never a JSON library's type error.
  const CheckpointManifest m =
      parse_checkpoint_manifest(read_file(mp.string()), fmt::format("checkpoint '{}': manifest.json", path));
  for (const char* f : kFiles) {
    auto entry = m.files.find(f);
    ATOLL_CHECK(entry != m.files.end(), "checkpoint '{}': manifest lists no '{}'", path, f);
    fs::path fp = fs::path(path) / f;
    ATOLL_CHECK(fs::exists(fp), "checkpoint '{}': file '{}' is missing", path, f);
    std::string bytes = read_file(fp.string());
    uint64_t want = entry->second.bytes;
    ATOLL_CHECK(bytes.size() == want, "checkpoint '{}': '{}' has {} bytes, the manifest says {} (truncated?); refusing to load",
                path, f, bytes.size(), want);
    uint32_t crc = crc32c(bytes);
    ATOLL_CHECK(crc == entry->second.crc32c,
                "checkpoint '{}': checksum mismatch in '{}' (corrupt); refusing to load", path, f);
  }
}

Checkpoint CheckpointStore::load(const std::string& path) {
  std::string why = checkpoint_problem(path);  // checksums, then a state.json the trainer can use
  ATOLL_CHECK(why.empty(), "{}", why);
  Checkpoint ck;
  TensorFile mf = load_safetensors((fs::path(path) / "model.safetensors").string());
  ck.model = std::move(mf.tensors);
  ck.model_metadata = std::move(mf.metadata);
  ck.optimizer = load_safetensors((fs::path(path) / "optimizer.safetensors").string()).tensors;
  ck.state = nlohmann::json::parse(read_file((fs::path(path) / "state.json").string()));
  return ck;
}

}  // namespace atl
