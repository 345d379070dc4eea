// Which checkpoint a run resumes from, and which ones retention may remove.
//
// `latest` is only a hint: a crash, a refused checkpoint the user deleted, or a copy made by hand
// can leave it pointing at a missing, partial or corrupt directory. Resuming therefore walks the
// step directories from the highest step down and takes the first one that is complete and
// verified (every checksum, and a state.json that parses with the fields the trainer needs), so
// that a bad newest checkpoint costs the steps since the one before it, never the whole run.
#pragma once
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace atl {

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
};

// The step_NNNNNNNN directories under dir (no .tmp/.old), ordered by step number, lowest first.
std::vector<CheckpointEntry> list_checkpoints(const std::string& dir);

// Empty when the checkpoint at path is complete and verified; otherwise why it is not.
std::string checkpoint_problem(const std::string& path);

struct ResumeChoice {
  std::optional<CheckpointEntry> chosen;  // the newest complete, verified checkpoint
  std::vector<std::string> rejected;      // "step_N: why", newest first, for the ones skipped
  std::string latest_hint;                // what `latest` named ("" when absent)
};
ResumeChoice choose_resume_checkpoint(const std::string& dir);

// Retention: the step directories to remove so that at most `keep` remain, oldest by step number
// first, never one whose step is in `protect` (the one resumed from, the newest verified one).
std::vector<CheckpointEntry> retention_victims(const std::vector<CheckpointEntry>& all, int keep,
                                               const std::set<int64_t>& protect);

// Temporary directories a crash left behind (step_N.tmp, step_N.old) that hold only files a
// checkpoint save writes; returns the ones removed. Others are left alone and reported in `kept`.
std::vector<std::string> clean_stale_checkpoint_temps(const std::string& dir, std::vector<std::string>* kept);

// The optimizer whose state these tensor names are ("adamw" for the plain names, "muon+adamw"
// for a grouped one's "<group>.step" counters), or "" when they say nothing.
std::string optimizer_of_state(const std::vector<std::string>& tensor_names);

}  // namespace atl
