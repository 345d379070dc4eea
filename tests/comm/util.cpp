// Running commands with a deadline, for the tests that start whole jobs.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>

#include "comm_test_util.h"

namespace atl::comm::test {

int Proc::exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

std::string self_exe() {
  char buf[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  ATOLL_CHECK(n > 0, "readlink /proc/self/exe failed");
  return std::string(buf, size_t(n));
}

std::string atoll_exe() { return std::string(ATOLL_BINARY_DIR) + "/atoll"; }

int count_of(const std::string& hay, const std::string& needle) {
  int k = 0;
  for (size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++k;
  return k;
}

Proc run(const std::vector<std::string>& argv, double timeout_s, const std::vector<std::string>& env) {
  int fds[2];
  ATOLL_CHECK(pipe2(fds, O_CLOEXEC) == 0, "pipe failed");
  std::vector<std::string> args = argv;
  std::vector<char*> av;
  for (auto& a : args) av.push_back(a.data());
  av.push_back(nullptr);
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = fork();
  ATOLL_CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    for (auto& e : env) putenv(const_cast<char*>(e.c_str()));
    execvp(av[0], av.data());
    _exit(127);
  }
  setpgid(pid, pid);
  close(fds[1]);
  Proc p;
  char buf[8192];
  bool open = true;
  for (;;) {
    double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (el > timeout_s && !p.timed_out) {
      p.timed_out = true;
      kill(-pid, SIGKILL);
    }
    if (open) {
      pollfd pf{fds[0], POLLIN, 0};
      poll(&pf, 1, 100);
      if (pf.revents) {
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n > 0)
          p.out.append(buf, size_t(n));
        else
          open = false;
      }
    } else {
      usleep(20000);
    }
    int st;
    // Something outside the process group may hold the pipe; stop waiting for it eventually.
    if (p.timed_out && el > timeout_s + 5) open = false;
    if (!open && waitpid(pid, &st, WNOHANG) == pid) {
      p.status = st;
      break;
    }
  }
  close(fds[0]);
  p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

}  // namespace atl::comm::test
