// Line-oriented TCP for the fault-tolerance control plane (the lighthouse and its clients): short
// text messages, one per line, over blocking sockets with deadlines. Not for tensors: those go
// over the communicator.
#pragma once
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace atl::resilience {

using Millis = std::chrono::milliseconds;

// A listening socket on host:port (port 0 picks a free one); returns the fd, sets `port`.
int listen_on(const std::string& host, int& port);
// Connects to host:port, retrying for `within`; throws atl::Error naming the address.
int connect_to(const std::string& host, int port, Millis within);
// A thread that accepts on listen_fd and hands each connection to on_conn, both under `mu`, until
// `stop` (read under `mu`) is set; the owner sets it, then shuts listen_fd down to wake the accept.
// A connection accepted while stopping is closed, so no handler starts after the owner's join.
std::thread accept_loop(int listen_fd, std::mutex& mu, const bool& stop, std::function<void(int fd)> on_conn);

class LineConn {
 public:
  explicit LineConn(int fd = -1) : fd_(fd) {}
  ~LineConn();
  LineConn(const LineConn&) = delete;
  LineConn& operator=(const LineConn&) = delete;
  LineConn(LineConn&& o) noexcept : fd_(o.fd_), buf_(std::move(o.buf_)) { o.fd_ = -1; }
  LineConn& operator=(LineConn&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = o.fd_;
      buf_ = std::move(o.buf_);
      o.fd_ = -1;
    }
    return *this;
  }
  bool open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // false when the peer has gone (the connection is then closed).
  bool send_line(const std::string& line);
  // One line without its '\n'; false on EOF, error or when nothing came within `within` (< 0: forever).
  bool read_line(std::string& line, Millis within = Millis(-1));
  // Raw bytes, for payloads that follow a header line (peer snapshots): false when the peer has gone.
  bool send_bytes(const void* data, size_t n);
  // Exactly n bytes (after whatever a read_line buffered) appended to out; false on EOF, error or
  // when they did not all come within `within` (< 0: forever).
  bool read_bytes(std::string& out, size_t n, Millis within = Millis(-1));
  void close();
  // Wakes a reader blocked in read_line on another thread (shutdown, the fd stays valid).
  void shutdown();

 private:
  int fd_;
  std::string buf_;
};

}  // namespace atl::resilience
