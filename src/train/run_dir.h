// A run directory's life cycle: one job at a time (a lock file naming the holder's host and PID),
// never reused by accident (a run dir that holds checkpoints or metrics needs --resume, or
// --overwrite, which moves the old files aside into old-<timestamp>/ and deletes nothing), checked
// to be a writable directory at start-up rather than at the first save, and swept of the
// temporary directories a killed save left behind.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace atl {

class Config;

struct RunDirOptions {
  bool overwrite = false;  // [run] overwrite, `atoll train --overwrite`
  static RunDirOptions from_config(Config& cfg);
};

// Holds run_dir/lock while alive (flock on the file, so a crashed holder releases it at once; the
// file's text says who holds it). A second holder is refused naming the first; a lock file whose
// holder is gone (dead PID, or no flock held) is taken over with a message.
class RunDirLock {
 public:
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Fails with a message naming `what` (e.g. "run.dir") when path exists and is not a directory,
// cannot be created, or is not writable (probed by creating a file in it).
void check_writable_dir(const std::string& path, const std::string& what);

struct RunDirState {
  std::unique_ptr<RunDirLock> lock;  // rank 0 only
};

// Rank 0, before anything is read or written in the run dir: checks run_dir and its checkpoints/
// are writable directories, takes the lock, refuses to reuse a run without resume or overwrite
// (moving the old run aside on overwrite), and removes stale step_N.tmp/.old directories.
RunDirState prepare_run_dir(const std::string& run_dir, bool resume, const RunDirOptions& o);

// The checkpoint --resume continues from: the newest complete, verified one under ck_dir,
// whatever `latest` says (verbose: say which were skipped and why). Empty when ck_dir holds no
// checkpoint at all; fails, listing why, when it holds some and none of them is usable, so that a
// run is never restarted from scratch over its own checkpoints. certified: the newest whose replay
// certificate is also clean ([fault] resume_certified, resilience/scout_replay.h).
std::string resume_checkpoint(const std::string& ck_dir, bool verbose, bool certified = false);

// Loading a checkpoint's optimizer state into the configured optimizer failed: fails saying so
// plainly when the checkpoint was written by another optimizer, else with the original error.
[[noreturn]] void fail_resume_load(const std::string& ckpt, const std::vector<std::string>& optimizer_tensor_names,
                                   const std::string& configured_optimizer, const std::string& error);

// Where prepare_run_dir moved an overwritten run's files: run_dir/old-YYYYmmdd-HHMMSS[-k].
std::string aside_dir_name(const std::string& run_dir);

}  // namespace atl
