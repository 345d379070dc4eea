#include "train/run_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <set>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"
#include "resilience/checkpoint_select.h"
#include "resilience/scout_replay.h"

namespace atl {
namespace fs = std::filesystem;

RunDirOptions RunDirOptions::from_config(Config& cfg) {
  RunDirOptions o;
  o.overwrite = cfg.get_bool("run.overwrite", false);
  return o;
}

namespace {

std::string host_name() {
  char h[256] = {0};
  if (::gethostname(h, sizeof h - 1) != 0) return "?";
  return h;
}

std::string now_text(const char* fmt_) {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char b[64];
  std::strftime(b, sizeof b, fmt_, &tm);
  return b;
}

struct Holder {
  std::string host, started;
  long pid = 0;
  std::string describe() const {
    return fmt::format("pid {} on host {}{}", pid, host.empty() ? "?" : host,
                       started.empty() ? "" : " (since " + started + ")");
  }
};

// The lock file's text: "host=H pid=P started=T".
Holder parse_holder(const std::string& text) {
  Holder h;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find_first_of(" \n", pos);
    if (end == std::string::npos) end = text.size();
    std::string kv = text.substr(pos, end - pos);
    size_t eq = kv.find('=');
    if (eq != std::string::npos) {
      std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
      if (k == "host") h.host = v;
      else if (k == "pid") h.pid = std::strtol(v.c_str(), nullptr, 10);
      else if (k == "started") h.started = v;
    }
    pos = end + 1;
  }
  return h;
}

std::string read_fd(int fd) {
  std::string s;
  char b[512];
  ::lseek(fd, 0, SEEK_SET);
  ssize_t n;
  while ((n = ::read(fd, b, sizeof b)) > 0) s.append(b, size_t(n));
  return s;
}

}  // namespace

RunDirLock::RunDirLock(const std::string& run_dir) : path_((fs::path(run_dir) / "lock").string()) {
  for (int attempt = 0;; ++attempt) {
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    ATOLL_CHECK(fd >= 0, "cannot create the run directory's lock file '{}': {}", path_, std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int e = errno;
      Holder h = parse_holder(read_fd(fd));
      ::close(fd);
      if (e != EWOULDBLOCK) fail("cannot lock '{}': {}", path_, std::strerror(e));
      fail("run.dir '{}' is in use by another job: {} holds its lock ({}); wait for that job to end, stop it, "
           "or choose another run.dir",
           run_dir, h.describe(), path_);
    }
    // The holder we raced with may have removed the file between our open and our flock.
    struct stat a {}, b {};
    if (::fstat(fd, &a) != 0 || ::stat(path_.c_str(), &b) != 0 || a.st_ino != b.st_ino) {
      ::close(fd);
      ATOLL_CHECK(attempt < 10, "cannot lock '{}': it keeps being replaced", path_);
      continue;
    }
    std::string old = read_fd(fd);
    if (old.find("pid=") != std::string::npos) {
      Holder h = parse_holder(old);
      bool same_host = h.host == host_name();
      bool alive = same_host && h.pid > 0 && (::kill(pid_t(h.pid), 0) == 0 || errno == EPERM);
      log::warn("run.dir '{}': taking over a stale lock left by {} ({})", run_dir, h.describe(),
                !same_host ? "it holds no lock any more" : alive ? "that PID holds no lock on it" : "that process is gone");
    }
    std::string me = fmt::format("host={} pid={} started={}\n", host_name(), long(::getpid()),
                                 now_text("%Y-%m-%dT%H:%M:%SZ"));
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != ssize_t(me.size())) {
      int e = errno;
      ::close(fd);
      fail("cannot write the lock file '{}': {}", path_, std::strerror(e));
    }
    fd_ = fd;
    return;
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while still holding it: nobody can take a lock on a file being removed
  ::close(fd_);
}

void check_writable_dir(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (fs::exists(path, ec) && !fs::is_directory(path, ec))
    fail("{} '{}' is a file, not a directory; remove it or choose another {}", what, path, what);
  fs::create_directories(path, ec);
  if (ec) fail("cannot create {} '{}': {}", what, path, ec.message());
  // access(W_OK) says nothing about read-only mounts or, as root, about permissions: write a file.
  std::string probe = (fs::path(path) / fmt::format(".atoll_write_probe_{}", long(::getpid()))).string();
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    fail("{} '{}' is not writable ({}): checkpoints and metrics could not be saved; fix its permissions or "
         "choose another {}",
         what, path, std::strerror(errno), what);
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string aside_dir_name(const std::string& run_dir) {
  std::string base = (fs::path(run_dir) / ("old-" + now_text("%Y%m%d-%H%M%S"))).string();
  std::string d = base;
  for (int k = 1; fs::exists(d); ++k) d = base + "-" + std::to_string(k);
  return d;
}

RunDirState prepare_run_dir(const std::string& run_dir, bool resume, const RunDirOptions& o) {
  ATOLL_CHECK(!(resume && o.overwrite),
              "--resume and --overwrite contradict each other: --resume continues the run in '{}', --overwrite "
              "starts a new one there (moving the old files aside)",
              run_dir);
  RunDirState st;
  check_writable_dir(run_dir, "run.dir");
  st.lock = std::make_unique<RunDirLock>(run_dir);
  const std::string ck_dir = (fs::path(run_dir) / "checkpoints").string();
  check_writable_dir(ck_dir, "the checkpoint directory");
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  std::error_code ec;
  auto cks = list_checkpoints(ck_dir);
  bool has_metrics = fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0;
  if (!resume && (!cks.empty() || has_metrics)) {
    std::string what = cks.empty() ? std::string("metrics.jsonl")
                                   : fmt::format("{} checkpoint(s) up to step {}{}", cks.size(), cks.back().step,
                                                 has_metrics ? " and metrics.jsonl" : "");
    ATOLL_CHECK(o.overwrite,
                "run.dir '{}' already holds a run ({}); pass --resume to continue it, --overwrite to start a new "
                "one there (the old files are moved to {}/old-<time>/, nothing is deleted), or choose another "
                "run.dir",
                run_dir, what, run_dir);
    std::string aside = aside_dir_name(run_dir);
    fs::create_directories(aside);
    fs::rename(ck_dir, fs::path(aside) / "checkpoints");
    if (fs::exists(metrics, ec)) fs::rename(metrics, fs::path(aside) / "metrics.jsonl");
    log::warn("--overwrite: the previous run in '{}' ({}) was moved to '{}'", run_dir, what, aside);
    check_writable_dir(ck_dir, "the checkpoint directory");
  }
  std::vector<std::string> kept;
  for (auto& d : clean_stale_checkpoint_temps(ck_dir, &kept))
    log::info("removed '{}', left by a checkpoint save that did not finish", d);
  for (auto& d : kept)
    log::warn("'{}' looks like an unfinished checkpoint save but holds files atoll does not write; left alone", d);
  return st;
}

std::string resume_checkpoint(const std::string& ck_dir, bool verbose, bool certified) {
  ResumeChoice rc = certified ? resilience::choose_certified_checkpoint(ck_dir) : choose_resume_checkpoint(ck_dir);
  if (!rc.chosen) {
    if (rc.rejected.empty()) return "";
    std::string why;
    for (auto& r : rc.rejected) why += "\n  " + r;
    fail("--resume: no complete, verified{} checkpoint in '{}' to continue from:{}\nnothing was changed; move the bad "
         "checkpoints away to start from an older one, or start over with --overwrite (which moves them aside)",
         certified ? " and certified (fault.resume_certified)" : "", ck_dir, why);
  }
  if (verbose) {
    for (auto& r : rc.rejected) log::warn("--resume: skipping {}", r);
    std::string chosen_name = fs::path(rc.chosen->path).filename().string();
    if (!rc.latest_hint.empty() && rc.latest_hint != chosen_name)
      log::warn("--resume: 'latest' names {}, but the newest complete, verified checkpoint is {}", rc.latest_hint,
                chosen_name);
  }
  return rc.chosen->path;
}

void fail_resume_load(const std::string& ckpt, const std::vector<std::string>& names, const std::string& configured,
                      const std::string& error) {
  std::string had = optimizer_of_state(names);
  std::string want = configured.substr(0, configured.find_first_of(" ("));
  auto parts = [](const std::string& s) {  // "muon+adamw" and "adamw+muon" are one optimizer
    std::set<std::string> p;
    for (size_t i = 0, j; i <= s.size(); i = j + 1) {
      j = s.find('+', i);
      if (j == std::string::npos) j = s.size();
      p.insert(s.substr(i, j - i));
    }
    return p;
  };
  if (!had.empty() && parts(had) != parts(want))
    fail("cannot resume from '{}': it holds the state of the '{}' optimizer, but the config trains with '{}'; resume "
         "with the optimizer the run was trained with ([optim] type and the group keys), or start a new run",
         ckpt, had, want);
  fail("cannot resume from '{}': {}", ckpt, error);
}

}  // namespace atl
