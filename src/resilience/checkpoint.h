// Checkpoints on disk: one directory per step holding the model weights (safetensors with
// Hugging Face GPT-2 names, loadable by PyTorch), the optimizer state, and a JSON state (step,
// RNG, data position, config), plus a manifest of every file's size and CRC-32C.
//
// A checkpoint is written into a temporary directory and renamed into place, then `latest` is
// switched atomically; a crash at any point leaves the previous checkpoint intact. Loading checks
// every checksum first, so a corrupt or truncated checkpoint is refused before anything is read
// into the model.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "tensor/safetensors.h"

namespace atl {

struct Checkpoint {
  std::vector<std::pair<std::string, Tensor>> model;
  std::map<std::string, std::string> model_metadata;
  std::vector<std::pair<std::string, Tensor>> optimizer;
  nlohmann::json state;  // trainer-defined: step, rng, data loader, ...
};

class CheckpointStore {
 public:
  // keep: how many most recent checkpoints to keep (older ones, by step number, are removed after
  // a save; see checkpoint_select.h for what is never removed).
  CheckpointStore(std::string dir, int keep = 3);
  // Returns the checkpoint's directory.
  std::string save(int64_t step, const Checkpoint& ck);
  // The newest complete checkpoint, if any.
  std::optional<std::string> latest() const;
  const std::string& dir() const { return dir_; }
  // Retention never removes this step (the checkpoint a run resumed from).
  void protect(int64_t step) { protected_.insert(step); }
  // Retention never removes this step either: the newest checkpoint with a clean replay
  // certificate (resilience/scout_replay.h), which a certified resume needs however many uncertified
  // ones were written after it. Replaces the previous one.
  void keep_certified(int64_t step) { certified_ = step; }

  // Verifies the manifest's checksums, then decodes. Throws naming the bad file.
  static Checkpoint load(const std::string& path);
  // Only verifies (used before resuming and by `atoll checkpoint verify`).
  static void verify(const std::string& path);

 private:
  std::string dir_;
  int keep_;
  std::set<int64_t> protected_;
  int64_t certified_ = -1;
};

}  // namespace atl
