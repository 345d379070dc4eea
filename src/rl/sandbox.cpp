#include "rl/sandbox.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace fs = std::filesystem;

namespace atl::rl {
namespace {

std::string slurp(const fs::path& p, int64_t cap = -1) {
  std::ifstream f(p, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (cap >= 0 && int64_t(s.size()) > cap) s.resize(size_t(cap));
  return s;
}

void write_tree(const std::string& dir, const std::map<std::string, std::string>& files) {
  fs::remove_all(dir);  // does not follow symlinks: a planted link's target survives
  fs::create_directories(dir);
  for (const auto& [rel, bytes] : files) {
    const fs::path p = fs::path(dir) / rel;
    if (!rel.empty() && rel.back() == '/') {
      fs::create_directories(p);
    } else if (rel.size() > 3 && rel.ends_with(" ->")) {
      fs::create_symlink(bytes, fs::path(dir) / rel.substr(0, rel.size() - 3));
    } else {
      fs::create_directories(p.parent_path());
      std::ofstream f(p, std::ios::binary | std::ios::trunc);
      f.write(bytes.data(), std::streamsize(bytes.size()));
      ATOLL_CHECK(f.good(), "sandbox: cannot write {}", p.string());
    }
  }
}

// Processes of this user now: RLIMIT_NPROC counts them all, so the command's limit is relative.
int64_t user_processes() {
  int64_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    struct stat st;
    if (!name.empty() && std::isdigit((unsigned char)name[0]) && ::stat(e.path().c_str(), &st) == 0 && st.st_uid == getuid()) ++n;
  }
  return n;
}

// In the child, before exec: a private mount namespace where every mount is read-only except the
// command's temp root. Best effort (needs CAP_SYS_ADMIN); false if any step is refused.
bool isolate_mounts(const char* root) {
  if (unshare(CLONE_NEWNS) != 0) return false;
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  if (mount(root, root, nullptr, MS_BIND | MS_REC, nullptr) != 0) return false;
  struct mount_attr ro {};
  ro.attr_set = MOUNT_ATTR_RDONLY;
  if (syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE, &ro, sizeof ro) != 0) return false;
  struct mount_attr rw {};
  rw.attr_clr = MOUNT_ATTR_RDONLY;
  return syscall(SYS_mount_setattr, AT_FDCWD, root, AT_RECURSIVE, &rw, sizeof rw) == 0;
}

void put_str(std::ostream& o, const std::string& s) {
  const uint64_t n = s.size();
  o.write(reinterpret_cast<const char*>(&n), 8);
  o.write(s.data(), std::streamsize(n));
}
void put_i(std::ostream& o, int64_t v) { o.write(reinterpret_cast<const char*>(&v), 8); }
int64_t get_i(std::istream& i, const std::string& path) {
  int64_t v = 0;
  i.read(reinterpret_cast<char*>(&v), 8);
  ATOLL_CHECK(i.good(), "sandbox checkpoint {}: truncated", path);
  return v;
}
std::string get_str(std::istream& i, const std::string& path) {
  const int64_t n = get_i(i, path);
  ATOLL_CHECK(n >= 0 && n < (int64_t(1) << 32), "sandbox checkpoint {}: bad length {}", path, n);
  std::string s(size_t(n), '\0');
  i.read(s.data(), n);
  ATOLL_CHECK(i.good() || n == 0, "sandbox checkpoint {}: truncated", path);
  return s;
}
constexpr int64_t kMagic = 0x31584253'4c4f5441;  // "ATOLSBX1"

}  // namespace

std::map<std::string, std::string> read_tree(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    const std::string rel = it->path().lexically_relative(dir).string();
    if (it->is_symlink()) {
      out[rel + " ->"] = fs::read_symlink(it->path()).string();
    } else if (it->is_directory()) {
      out[rel + "/"] = "";
    } else if (it->is_regular_file()) {
      out[rel] = slurp(it->path());
    }
  }
  return out;
}

uint64_t sandbox_fingerprint(const std::string& dir) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const std::string& s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;  // separator: "ab"+"c" differs from "a"+"bc"
  };
  for (const auto& [k, v] : read_tree(dir)) mix(k), mix(v);
  return h;
}

void SandboxCheckpoint::save(const std::string& path) const {
  std::ofstream o(path, std::ios::binary | std::ios::trunc);
  put_i(o, kMagic);
  put_i(o, int64_t(files.size()));
  for (const auto& [k, v] : files) put_str(o, k), put_str(o, v);
  put_i(o, int64_t(log.size()));
  for (const auto& a : log) put_i(o, a.context_len), put_str(o, a.action), put_str(o, a.result);
  put_i(o, int64_t(context.size()));
  for (int32_t t : context) put_i(o, t);
  put_str(o, pending), put_str(o, failure);
  put_i(o, done ? 1 : 0);
  o.write(reinterpret_cast<const char*>(&reward), 8);
  ATOLL_CHECK(o.good(), "sandbox checkpoint {}: cannot write", path);
}

SandboxCheckpoint SandboxCheckpoint::load(const std::string& path) {
  std::ifstream i(path, std::ios::binary);
  ATOLL_CHECK(i.good(), "sandbox checkpoint {}: cannot open", path);
  ATOLL_CHECK(get_i(i, path) == kMagic, "sandbox checkpoint {}: not a sandbox checkpoint", path);
  SandboxCheckpoint c;
  for (int64_t n = get_i(i, path); n > 0; --n) {
    std::string k = get_str(i, path);
    c.files[k] = get_str(i, path);
  }
  for (int64_t n = get_i(i, path); n > 0; --n) {
    ActionRecord a;
    a.context_len = get_i(i, path);
    a.action = get_str(i, path);
    a.result = get_str(i, path);
    c.log.push_back(a);
  }
  for (int64_t n = get_i(i, path); n > 0; --n) c.context.push_back(int32_t(get_i(i, path)));
  c.pending = get_str(i, path);
  c.failure = get_str(i, path);
  c.done = get_i(i, path) != 0;
  i.read(reinterpret_cast<char*>(&c.reward), 8);
  ATOLL_CHECK(i.good(), "sandbox checkpoint {}: truncated", path);
  return c;
}

SandboxEpisode::SandboxEpisode(std::string dir, Problem p, SandboxLimits lim,
                               std::map<std::string, std::vector<std::string>> commands)
    : dir_(std::move(dir)), p_(std::move(p)), lim_(lim), commands_(std::move(commands)) {
  for (const auto& [name, argv] : commands_)
    ATOLL_CHECK(!argv.empty() && fs::path(argv[0]).is_absolute(), "sandbox command '{}': argv[0] must be an absolute path", name);
  // The directory is emptied: refuse the obvious catastrophes (the root, the working directory).
  ATOLL_CHECK(!dir_.empty() && fs::weakly_canonical(dir_) != fs::path("/") &&
                  fs::weakly_canonical(dir_) != fs::weakly_canonical(fs::current_path()),
              "sandbox: '{}' cannot be an episode directory (it is emptied)", dir_);
  write_tree(dir_, {});
  dir_ = fs::canonical(dir_).string();
}

void SandboxEpisode::feed(const std::vector<int32_t>& tokens) {
  for (int32_t t : tokens) {
    context_.push_back(t);
    if (done_) continue;
    if (t == ';' || t == kEndMarker) {
      if (!pending_.empty()) act(pending_);
      pending_.clear();
    } else {
      pending_ += (t >= 32 && t < 127) ? char(t) : '?';
    }
  }
}

void SandboxEpisode::end(double reward, std::string why) {
  done_ = true;
  reward_ = reward;
  failure_ = std::move(why);
}

std::string SandboxEpisode::act(const std::string& action) {
  std::string result;
  if (done_) {
    result = "ignored: episode over";
  } else {
    std::istringstream in(action);
    std::string verb;
    in >> verb;
    if (verb == "write") {
      std::string rel;
      in >> rel;
      std::string content;
      std::getline(in >> std::ws, content);
      result = write_file(rel, content);
    } else if (verb == "run") {
      std::string name, arg;
      in >> name;
      auto it = commands_.find(name);
      if (it == commands_.end()) {
        result = "unknown command '" + name + "'";
      } else {
        std::vector<std::string> argv = it->second;
        while (in >> arg) argv.push_back(arg);
        result = run_command(argv);
      }
    } else if (verb == "check") {
      result = check();
    } else {
      result = "unknown action '" + verb + "'";
    }
    if (!done_ && !result.starts_with("ok")) end(0, result);
  }
  log_.push_back({int64_t(context_.size()), action, result});
  return result;
}

std::string SandboxEpisode::write_file(const std::string& rel, const std::string& content) {
  if (rel.empty()) return "bad write: no path";
  const fs::path p(rel);
  if (p.is_absolute()) return "escape: absolute path " + rel;
  fs::path cur(dir_);
  for (const auto& part : p) {
    if (part == ".." || part == ".") return "escape: '" + part.string() + "' in " + rel;
    cur /= part;
    if (fs::is_symlink(cur)) return "escape: symlink " + cur.lexically_relative(dir_).string() + " in " + rel;
  }
  if (int64_t(content.size()) > lim_.file_bytes) return "file size limit: " + rel;
  // The resolved parent must still be the sandbox or under it (belt and braces over the checks).
  const fs::path parent = fs::weakly_canonical(cur.parent_path());
  const std::string ps = parent.string();
  if (ps != dir_ && !ps.starts_with(dir_ + "/")) return "escape: " + rel + " resolves outside";
  fs::create_directories(parent);
  const int fd = ::open(cur.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return "escape: cannot open " + rel + ": " + std::strerror(errno);
  const bool ok = ::write(fd, content.data(), content.size()) == ssize_t(content.size());
  ::close(fd);
  return ok ? "ok" : "write failed: " + rel;
}

std::string SandboxEpisode::check() {
  const fs::path a = fs::path(dir_) / "answer.txt";
  if (fs::is_symlink(a)) {
    end(0, "escape: answer.txt is a symlink");
  } else if (!fs::is_regular_file(a)) {
    end(0, "no answer.txt");
  } else {
    std::string s = slurp(a, 4096);
    while (!s.empty() && std::isspace((unsigned char)s.back())) s.pop_back();
    if (s == p_.answer)
      end(1, "correct");
    else
      end(0, "wrong answer '" + s + "'");
  }
  return "ok: " + failure_;
}

std::string SandboxEpisode::run_command(const std::vector<std::string>& argv) {
  char tmpl[] = "/tmp/atoll_sbx_XXXXXX";
  ATOLL_CHECK(::mkdtemp(tmpl) != nullptr, "sandbox: mkdtemp: {}", std::strerror(errno));
  const std::string root = tmpl, work = root + "/work";
  struct Cleanup {
    std::string r;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(r, ec);
    }
  } cleanup{root};
  write_tree(work, read_tree(dir_));

  const int64_t nproc = user_processes() + lim_.extra_procs;
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  int out[2];
  ATOLL_CHECK(::pipe2(out, O_CLOEXEC) == 0, "sandbox: pipe: {}", std::strerror(errno));
  const pid_t pid = ::fork();
  ATOLL_CHECK(pid >= 0, "sandbox: fork: {}", std::strerror(errno));
  if (pid == 0) {
    // Child: only async-signal-safe calls from here to exec.
    ::setpgid(0, 0);
    sigset_t none;  // `atoll train` blocks SIGTERM/SIGINT in its threads (train/stop_signals.h): not here
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    if (lim_.isolate) isolate_mounts(root.c_str());
    // Hard one above soft: at the CPU limit the soft one's SIGXCPU comes first (and is the reason).
    auto lim = [](int r, int64_t v) {
      struct rlimit rl{rlim_t(v), rlim_t(r == RLIMIT_CPU ? v + 1 : v)};
      ::setrlimit(r, &rl);
    };
    lim(RLIMIT_CPU, lim_.cpu_s);
    lim(RLIMIT_FSIZE, lim_.file_bytes);
    lim(RLIMIT_NPROC, nproc);
    lim(RLIMIT_AS, lim_.address_bytes);
    lim(RLIMIT_CORE, 0);
    const int devnull = ::open("/dev/null", O_RDONLY);
    ::dup2(devnull, 0);
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    if (::chdir(work.c_str()) != 0) ::_exit(126);
    ::syscall(SYS_close_range, 3u, ~0u, 0u);
    ::execv(cargv[0], cargv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::setpgid(pid, pid);  // also here: no race with the kill below
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);  // a grandchild may hold the pipe open after the exit
  std::string output;
  bool eof = false;
  const auto drain = [&] {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(out[0], buf, sizeof buf)) > 0)
      if (int64_t(output.size()) < lim_.max_output)
        output.append(buf, size_t(std::min<int64_t>(n, lim_.max_output - int64_t(output.size()))));
    if (n == 0) eof = true;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(lim_.wall_s);
  int status = 0;
  bool exited = false, timed_out = false;
  while (!exited) {
    if (eof) {
      ::usleep(10000);
    } else {
      struct pollfd pf{out[0], POLLIN, 0};
      if (::poll(&pf, 1, 10) > 0) drain();
    }
    exited = ::waitpid(pid, &status, WNOHANG) == pid;
    if (!exited && std::chrono::steady_clock::now() > deadline) {
      ::kill(-pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      exited = timed_out = true;
    }
  }
  drain();  // what it wrote just before exiting
  ::kill(-pid, SIGKILL);  // whatever it left running in its group
  ::close(out[0]);

  std::string why;
  if (timed_out) {
    why = "timeout";
  } else if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    why = sig == SIGXCPU ? "cpu limit" : sig == SIGXFSZ ? "file size limit" : std::string("crash: signal ") + ::strsignal(sig);
  } else if (WEXITSTATUS(status) != 0) {
    why = "exit status " + std::to_string(WEXITSTATUS(status));
  }
  // Anything in the private root but its copy was written outside the sandbox; a symlink in the
  // copy could point anywhere. Either way nothing is taken back.
  if (why.empty())
    for (const auto& e : fs::directory_iterator(root))
      if (e.path().filename() != "work") why = "escape: wrote ../" + e.path().filename().string() + " outside the sandbox";
  if (why.empty())
    for (const auto& [rel, v] : read_tree(work))
      if (rel.ends_with(" ->")) why = "escape: left symlink " + rel + " " + v;
  if (!why.empty()) return why + (output.empty() ? "" : " (output: " + output + ")");
  write_tree(dir_, read_tree(work));
  return output.empty() ? "ok" : "ok: " + output;
}

bool sandbox_can_isolate() {
  static const bool ok = [] {
    char tmpl[] = "/tmp/atoll_sbxprobe_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return false;
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(isolate_mounts(tmpl) ? 0 : 1);
    int status = 1;
    if (pid > 0) ::waitpid(pid, &status, 0);
    ::rmdir(tmpl);
    return pid > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }();
  return ok;
}

SandboxCheckpoint SandboxEpisode::checkpoint() const {
  return {read_tree(dir_), log_, context_, pending_, failure_, done_, reward_};
}

void SandboxEpisode::restore(const SandboxCheckpoint& c, const std::vector<int32_t>& journal) {
  ATOLL_CHECK(journal.size() >= c.context.size() && std::equal(c.context.begin(), c.context.end(), journal.begin()),
              "sandbox restore: the journal prefix ({} tokens) does not extend the checkpoint's context ({} tokens): "
              "the environment and the model would disagree",
              journal.size(), c.context.size());
  write_tree(dir_, c.files);
  log_ = c.log;
  context_ = c.context;
  pending_ = c.pending;
  failure_ = c.failure;
  done_ = c.done;
  reward_ = c.reward;
  feed(std::vector<int32_t>(journal.begin() + int64_t(c.context.size()), journal.end()));
}

}  // namespace atl::rl
