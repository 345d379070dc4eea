#include "resilience/line_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace atl::resilience {

// poll() for input on fd until `until` (or for ever when !bounded): > 0 readable, 0 timed out or
// closed (fd < 0), < 0 an error (EINTR included, for the caller to retry).
static int wait_readable(int fd, bool bounded, std::chrono::steady_clock::time_point until) {
  if (fd < 0) return 0;
  int wait_ms = -1;
  if (bounded) {
    auto left = std::chrono::duration_cast<Millis>(until - std::chrono::steady_clock::now()).count();
    if (left <= 0) return 0;
    wait_ms = int(left);
  }
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, wait_ms);
}

static bool resolve(const std::string& host, int port, sockaddr_in& a) {
  a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return true;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return true;
}

int listen_on(const std::string& host, int& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ATOLL_CHECK(fd >= 0, "socket(): {}", std::strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a;
  ATOLL_CHECK(resolve(host, port, a), "cannot resolve '{}'", host);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 128) != 0) {
    int e = errno;
    ::close(fd);
    fail("cannot listen on {}:{}: {}", host, port, std::strerror(e));
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port = ntohs(a.sin_port);
  return fd;
}

int connect_to(const std::string& host, int port, Millis within) {
  auto until = std::chrono::steady_clock::now() + within;
  sockaddr_in a;
  ATOLL_CHECK(resolve(host, port, a), "cannot resolve '{}'", host);
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ATOLL_CHECK(fd >= 0, "socket(): {}", std::strerror(errno));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    int e = errno;
    ::close(fd);
    if (std::chrono::steady_clock::now() > until)
      fail("cannot reach {}:{} within {:.1f} s: {}", host, port, within.count() / 1000.0, std::strerror(e));
    std::this_thread::sleep_for(Millis(20));
  }
}

LineConn::~LineConn() { close(); }

void LineConn::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void LineConn::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool LineConn::send_line(const std::string& line) {
  if (fd_ < 0) return false;
  std::string m = line + "\n";
  size_t off = 0;
  while (off < m.size()) {
    ssize_t n = ::send(fd_, m.data() + off, m.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

bool LineConn::send_bytes(const void* data, size_t n) {
  if (fd_ < 0) return false;
  const char* p = static_cast<const char*>(data);
  size_t off = 0;
  while (off < n) {
    ssize_t k = ::send(fd_, p + off, n - off, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    off += size_t(k);
  }
  return true;
}

bool LineConn::read_bytes(std::string& out, size_t n, Millis within) {
  auto until = std::chrono::steady_clock::now() + within;
  size_t take = std::min(n, buf_.size());
  out.append(buf_, 0, take);
  buf_.erase(0, take);
  n -= take;
  size_t base = out.size();
  out.resize(base + n);
  size_t got = 0;
  while (got < n) {
    const int r = wait_readable(fd_, within.count() >= 0, until);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    ssize_t k = ::recv(fd_, out.data() + base + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    got += size_t(k);
  }
  return true;
}

bool LineConn::read_line(std::string& line, Millis within) {
  auto until = std::chrono::steady_clock::now() + within;
  for (;;) {
    auto nl = buf_.find('\n');
    if (nl != std::string::npos) {
      line = buf_.substr(0, nl);
      buf_.erase(0, nl + 1);
      return true;
    }
    const int r = wait_readable(fd_, within.count() >= 0, until);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    char tmp[4096];
    ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    buf_.append(tmp, size_t(n));
  }
}

std::thread accept_loop(int listen_fd, std::mutex& mu, const bool& stop, std::function<void(int fd)> on_conn) {
  return std::thread([listen_fd, &mu, &stop, on_conn = std::move(on_conn)] {
    for (;;) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      std::lock_guard<std::mutex> lk(mu);
      if (stop) {
        if (fd >= 0) ::close(fd);
        return;
      }
      if (fd < 0) continue;
      on_conn(fd);
    }
  });
}

}  // namespace atl::resilience
