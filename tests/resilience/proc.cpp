#include "proc.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace atl::resilience::test {

pid_t spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log) {
  std::vector<std::string> args = argv, all = env;
  for (char** e = environ; *e; ++e) {
    std::string s = *e, key = s.substr(0, s.find('='));
    bool overridden = false;
    for (auto& o : env) overridden = overridden || o.compare(0, key.size() + 1, key + "=") == 0;
    if (!overridden) all.push_back(s);
  }
  std::vector<char*> av, ev;
  for (auto& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  for (auto& e : all) ev.push_back(e.data());
  ev.push_back(nullptr);
  int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ATOLL_CHECK(fd >= 0, "cannot open {}", log);
  pid_t pid = fork();
  ATOLL_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    execve(av[0], av.data(), ev.data());
    _exit(127);
  }
  close(fd);
  return pid;
}

int wait_for(pid_t pid, double timeout_s) {
  auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  ATOLL_CHECK(n > 0, "readlink /proc/self/exe failed");
  return std::string(buf, size_t(n));
}

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace atl::resilience::test
