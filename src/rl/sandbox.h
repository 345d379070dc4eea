// A stateful environment for agentic RL, the environment half of Belayer (fault tolerance for
// agentic RL): one directory per episode, a small command interface the model's output drives,
// a checker that scores the answer file, and checkpoint/restore of the directory (byte for byte)
// and the action log, tied to the model context (the token prefix the Belayer journal logs).
//
// The model's text is a list of ';'-terminated actions:
//   write <relpath> <content>   write a file inside the sandbox (content: the rest of the action)
//   run <name> [args...]        run a command the environment registered (argv only, no shell)
//   check                       score answer.txt against the problem; ends the episode
// A failed action (timeout, a write outside the sandbox, a crash, a non-zero exit) ends the episode
// with reward 0 and a logged reason; it never throws, never stops the run, and never touches files
// outside the sandbox: `write` refuses absolute paths, '..' and symlinked components; `run` runs
// in a private copy of the directory (its own temp root), in a mount namespace with the rest of
// the filesystem read-only where the kernel allows it, under rlimits and a wall-clock timeout that
// kills the process group; what it leaves in its copy is taken back only when it ran clean and
// left nothing outside its copy and no symlink.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rl/verifiable_task.h"

namespace atl::rl {

struct SandboxLimits {
  double wall_s = 2.0;                  // wall clock; past it the process group is SIGKILLed
  int64_t cpu_s = 2;                    // RLIMIT_CPU
  int64_t file_bytes = 1 << 20;         // RLIMIT_FSIZE
  int64_t extra_procs = 16;             // RLIMIT_NPROC = the user's processes now + this
  int64_t address_bytes = 1ll << 30;    // RLIMIT_AS
  int64_t max_output = 4096;            // stdout/stderr bytes kept for the log
  bool isolate = true;                  // try a mount namespace with / read-only
};

struct ActionRecord {
  int64_t context_len = 0;  // model-context tokens when the action was complete
  std::string action, result;  // result: "ok", "ok: <output>" or the failure reason
};

// A snapshot of an episode: every regular file of the directory, the log, the model context.
struct SandboxCheckpoint {
  std::map<std::string, std::string> files;  // relative path -> bytes (directories: trailing '/')
  std::vector<ActionRecord> log;
  std::vector<int32_t> context;
  std::string pending, failure;
  bool done = false;
  double reward = 0;
  void save(const std::string& path) const;
  static SandboxCheckpoint load(const std::string& path);
};

class SandboxEpisode {
 public:
  // dir is created (emptied if it exists); commands: name -> argv (argv[0] an absolute path) the
  // model may run by name, with its own arguments appended.
  SandboxEpisode(std::string dir, Problem p, SandboxLimits lim = {},
                 std::map<std::string, std::vector<std::string>> commands = {});

  // Appends model tokens to the context; runs each action as its ';' arrives. After the episode
  // ended, further tokens only extend the context.
  void feed(const std::vector<int32_t>& tokens);
  // One action, as text (without the ';'); returns its logged result.
  std::string act(const std::string& action);

  bool done() const { return done_; }
  double reward() const { return reward_; }
  // Why the reward is what it is: "correct", "wrong answer ...", "timeout", "escape: ...", ...
  const std::string& reason() const { return failure_; }
  const std::vector<ActionRecord>& log() const { return log_; }
  const std::vector<int32_t>& context() const { return context_; }
  const std::string& dir() const { return dir_; }

  SandboxCheckpoint checkpoint() const;
  // Restores the directory byte for byte and the log. The journal prefix (the model context a
  // shadow worker resumes from) must extend the checkpoint's context; its tokens past the
  // checkpoint are fed again, so the environment matches the context exactly.
  void restore(const SandboxCheckpoint& c, const std::vector<int32_t>& journal_prefix);
  void restore(const SandboxCheckpoint& c) { restore(c, c.context); }

 private:
  std::string run_command(const std::vector<std::string>& argv);
  std::string write_file(const std::string& rel, const std::string& content);
  std::string check();
  void end(double reward, std::string why);

  std::string dir_;
  Problem p_;
  SandboxLimits lim_;
  std::map<std::string, std::vector<std::string>> commands_;
  std::vector<int32_t> context_;
  std::string pending_, failure_;
  std::vector<ActionRecord> log_;
  bool done_ = false;
  double reward_ = 0;
};

// Whether a command can run in the read-only mount namespace here (a probe child tries it).
bool sandbox_can_isolate();
// A fingerprint of the tree (FNV-1a over every path and its bytes), for logs; tests compare read_tree.
uint64_t sandbox_fingerprint(const std::string& dir);
// Every regular file (and directory, with a trailing '/') under dir, relative path -> bytes;
// symlinks are listed as "-> target" so a comparison sees them.
std::map<std::string, std::string> read_tree(const std::string& dir);

}  // namespace atl::rl
