// TCP key-value store, in the role of PyTorch's TCPStore (torch.distributed): a rendezvous server
// that ranks use to publish their transport addresses and counters. The wire format is ours:
// every message is a 4-byte length and a payload whose first byte is the operation.
// One thread per connection keeps the server simple; a job has at most a few hundred clients.
#include "comm/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <cerrno>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/server_threads.h"

namespace atl::comm {

namespace {

enum Op : uint8_t { kSet = 1, kTryGet, kAdd, kWait, kCheck, kHello, kBye, kDead };

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put_i64(std::string& s, int64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }
void put_str(std::string& s, const std::string& v) {
  put_u32(s, uint32_t(v.size()));
  s += v;
}

struct Reader {
  const std::string& s;
  size_t pos = 0;
  void need(size_t n) {
    if (pos + n > s.size()) throw Error("tcp store: truncated message");
  }
  uint8_t u8() {
    need(1);
    return uint8_t(s[pos++]);
  }
  uint32_t u32() {
    need(4);
    uint32_t v;
    std::memcpy(&v, s.data() + pos, 4);
    pos += 4;
    return v;
  }
  int64_t i64() {
    need(8);
    int64_t v;
    std::memcpy(&v, s.data() + pos, 8);
    pos += 8;
    return v;
  }
  std::string str() {
    uint32_t n = u32();
    need(n);
    std::string v = s.substr(pos, n);
    pos += n;
    return v;
  }
};

// Full read/write; false on EOF or error (the caller decides what that means).
bool write_all(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= size_t(k);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t k = ::recv(fd, c, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    n -= size_t(k);
  }
  return true;
}
bool send_msg(int fd, const std::string& m) {
  uint32_t n = uint32_t(m.size());
  return write_all(fd, &n, 4) && write_all(fd, m.data(), m.size());
}
bool recv_msg(int fd, std::string& m) {
  uint32_t n;
  if (!read_all(fd, &n, 4)) return false;
  if (n > (1u << 30)) return false;
  m.resize(n);
  return read_all(fd, m.data(), n);
}

// Resolves host (name or address) to an IPv4 sockaddr.
sockaddr_in resolve(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  if (host.empty() || host == "0.0.0.0") {
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    return a;
  }
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  ATOLL_CHECK(rc == 0 && res, "tcp store: cannot resolve host '{}': {}", host, gai_strerror(rc));
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return a;
}

}  // namespace

namespace {

// The kernel's range for ports it hands out itself (bind to 0, connect): every Gloo pair and
// every outgoing connection of every job on the machine draws from it.
std::pair<int, int> ephemeral_range() {
  int lo = 32768, hi = 60999;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768, hi = 60999;
    std::fclose(f);
  }
  return {lo, hi};
}

bool can_bind(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ATOLL_CHECK(fd >= 0, "socket(): {}", std::strerror(errno));
  sockaddr_in a = resolve(host, port);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

// A port picked this way is free when picked but is only taken when rank 0 listens on it, a
// process start later. Taken from the kernel's ephemeral range (bind to 0), it was lost in that
// window to any connection the machine opened meanwhile: under `ctest -j2` the suite opens
// thousands, and CI lost a test to it ("Address already in use"). So the port is drawn at random
// from the 12,000 ports just below that range, which the kernel never hands out by itself; what
// is left is two pickers drawing the same port within one window, about one in 10^5 per pick.
// When the range leaves no room below (a tuned machine), the kernel's own choice is the fallback.
int pick_free_port(const std::string& host) {
  auto [lo, hi] = ephemeral_range();
  const int below_lo = std::max(1024, lo - 12000), below_hi = lo - 1;
  if (below_hi - below_lo >= 1000) {
    static std::mutex mu;
    static std::mt19937_64 rng(std::random_device{}() ^ (uint64_t(::getpid()) << 32) ^
                               uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
    for (int attempt = 0; attempt < 64; ++attempt) {
      int port;
      {
        std::lock_guard<std::mutex> lk(mu);
        port = below_lo + int(rng() % uint64_t(below_hi - below_lo + 1));
      }
      if (can_bind(host, port)) return port;
    }
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ATOLL_CHECK(fd >= 0, "socket(): {}", std::strerror(errno));
  sockaddr_in a = resolve(host, 0);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    int e = errno;
    ::close(fd);
    fail("cannot bind a port on {}: {}", host, std::strerror(e));
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// ---------------------------------------------------------------------------------------------
// Server

struct TcpStoreServer::Impl {
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;
  std::set<int> dead;
  bool stopping = false;
  std::set<int> client_fds;
  ServerThreads threads;  // one per client connection, joined as they finish
  std::thread acceptor;

  bool has_all(const std::vector<std::string>& keys) {
    for (auto& k : keys)
      if (!kv.count(k)) return false;
    return true;
  }

  void serve(int fd) {
    int hello_rank = -1;
    bool clean = false;
    std::string m;
    while (recv_msg(fd, m)) {
      std::string reply;
      try {
        Reader r{m};
        uint8_t op = r.u8();
        std::unique_lock<std::mutex> lk(mu);
        switch (op) {
          case kSet: {
            std::string k = r.str();
            kv[k] = r.str();
            cv.notify_all();
            reply.assign(1, char(1));
            break;
          }
          case kTryGet: {
            auto it = kv.find(r.str());
            reply = it == kv.end() ? std::string(1, char(0)) : std::string(1, char(1));
            if (it != kv.end()) put_str(reply, it->second);
            break;
          }
          case kAdd: {
            std::string k = r.str();
            int64_t d = r.i64();
            int64_t v = 0;
            if (auto it = kv.find(k); it != kv.end() && it->second.size() == 8)
              std::memcpy(&v, it->second.data(), 8);
            v += d;
            kv[k] = std::string(reinterpret_cast<const char*>(&v), 8);
            cv.notify_all();
            put_i64(reply, v);
            break;
          }
          case kWait:
          case kCheck: {
            uint32_t n = r.u32();
            std::vector<std::string> keys(n);
            for (auto& k : keys) k = r.str();
            if (op == kWait) {
              auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(r.i64());
              cv.wait_until(lk, until, [&] { return stopping || has_all(keys); });
            }
            reply.assign(1, char(has_all(keys)));
            break;
          }
          case kHello:
            hello_rank = int(r.i64());
            dead.erase(hello_rank);
            reply.assign(1, char(1));
            break;
          case kBye:
            clean = true;
            reply.assign(1, char(1));
            break;
          case kDead:
            put_u32(reply, uint32_t(dead.size()));
            for (int d : dead) put_i64(reply, d);
            break;
          default: return;  // not one of ours: drop the connection
        }
      } catch (const Error&) {
        break;
      }
      if (!send_msg(fd, reply)) break;
    }
    std::lock_guard<std::mutex> lk(mu);
    if (hello_rank >= 0 && !clean && !stopping) dead.insert(hello_rank);
    cv.notify_all();
    client_fds.erase(fd);
    ::close(fd);
  }

  void accept_loop() {
    for (;;) {
      pollfd p[2] = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
      int rc = ::poll(p, 2, -1);
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0 || (p[1].revents & POLLIN)) return;
      int fd = ::accept(listen_fd, nullptr, nullptr);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard<std::mutex> lk(mu);
      if (stopping) {
        ::close(fd);
        return;
      }
      client_fds.insert(fd);
      threads.start([this, fd] { serve(fd); });
    }
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port) : impl_(std::make_unique<Impl>()) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ATOLL_CHECK(fd >= 0, "tcp store: socket(): {}", std::strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = resolve(host, port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 1024) != 0) {
    int e = errno;
    ::close(fd);
    fail("tcp store: cannot listen on {}:{}: {} (is another job using this port?)", host, port,
         std::strerror(e));
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  impl_->listen_fd = fd;
  ATOLL_CHECK(::pipe2(impl_->wake, O_CLOEXEC) == 0, "tcp store: pipe(): {}", std::strerror(errno));
  impl_->acceptor = std::thread([this] { impl_->accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stopping = true;
    for (int fd : impl_->client_fds) ::shutdown(fd, SHUT_RDWR);
  }
  impl_->cv.notify_all();
  char c = 0;
  (void)!::write(impl_->wake[1], &c, 1);
  impl_->acceptor.join();
  impl_->threads.join_all();
  ::close(impl_->listen_fd);
  ::close(impl_->wake[0]);
  ::close(impl_->wake[1]);
}

// ---------------------------------------------------------------------------------------------
// Client

std::chrono::milliseconds connect_timeout(std::chrono::milliseconds collective) {
  if (const char* v = std::getenv("ATOLL_CONNECT_TIMEOUT"); v && *v) {
    char* end = nullptr;
    double s = std::strtod(v, &end);
    ATOLL_CHECK(end != v && *end == 0 && s > 0, "ATOLL_CONNECT_TIMEOUT='{}' is not a positive number of seconds", v);
    return std::chrono::milliseconds(int64_t(s * 1000));
  }
  return std::min(collective, std::chrono::milliseconds(60000));
}

TcpStore::TcpStore(const std::string& host, int port, Millis timeout, Millis connect_within)
    : timeout_(timeout), address_(host + ":" + std::to_string(port)) {
  sockaddr_in a = resolve(host, port);
  if (connect_within.count() < 0) connect_within = connect_timeout(timeout);
  auto begin = std::chrono::steady_clock::now();
  auto until = begin + connect_within;
  // A progress line every 10 s (sooner for short deadlines): a silent wait looks like a hang.
  const Millis note_every = std::clamp(connect_within / 4, Millis(250), Millis(10000));
  auto next_note = begin + note_every;
  std::string last;
  for (;;) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ATOLL_CHECK(fd >= 0, "tcp store: socket(): {}", std::strerror(errno));
    // Non-blocking, so that an unreachable address (no answer to SYN) cannot hold one attempt past
    // the deadline for the kernel's two minutes.
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), err = rc == 0 ? 0 : errno;
    if (rc != 0 && err == EINPROGRESS) {
      auto left = std::chrono::duration_cast<Millis>(until - std::chrono::steady_clock::now());
      pollfd p{fd, POLLOUT, 0};
      int pr = ::poll(&p, 1, int(std::clamp(left, Millis(1), Millis(1000)).count()));
      socklen_t len = sizeof err;
      if (pr == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0) rc = err == 0 ? 0 : -1;
      else err = ETIMEDOUT;
    }
    if (rc == 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      fd_ = fd;
      return;
    }
    last = std::strerror(err);
    ::close(fd);
    auto now = std::chrono::steady_clock::now();
    if (now > until)
      fail("cannot reach the rendezvous store at {} within {:.1f} s ({}); check MASTER_ADDR and "
           "MASTER_PORT, and that rank 0 or `atoll launch` on node 0 is running (ATOLL_CONNECT_TIMEOUT "
           "sets how long to try)",
           address_, connect_within.count() / 1000.0, last);
    if (now > next_note) {
      next_note = now + note_every;
      std::string m = fmt::format("atoll: still trying to reach the rendezvous store at {} ({:.1f} s of {:.1f} s): {}\n",
                                  address_, std::chrono::duration<double>(now - begin).count(),
                                  connect_within.count() / 1000.0, last);
      (void)!::write(2, m.data(), m.size());
    }
    std::this_thread::sleep_for(Millis(50));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStore::request(const std::string& msg, Millis reply_within) {
  std::lock_guard<std::mutex> lk(mu_);
  ATOLL_CHECK(fd_ >= 0, "the connection to the rendezvous store at {} was lost earlier", address_);
  // A receive timeout so that a store that stops answering cannot hang us.
  timeval tv{};
  auto ms = reply_within.count() + 5000;
  tv.tv_sec = ms / 1000;
  tv.tv_usec = (ms % 1000) * 1000;
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  std::string reply;
  if (!send_msg(fd_, msg) || !recv_msg(fd_, reply)) {
    ::close(fd_);
    fd_ = -1;
    fail("lost the connection to the rendezvous store at {} (its host, `atoll launch` on node 0 "
         "or rank 0, has probably exited)",
         address_);
  }
  return reply;
}

void TcpStore::set(const std::string& key, const std::string& value) {
  std::string m(1, char(kSet));
  put_str(m, key);
  put_str(m, value);
  request(m, timeout_);
}

std::optional<std::string> TcpStore::try_get(const std::string& key) {
  std::string m(1, char(kTryGet));
  put_str(m, key);
  std::string r = request(m, timeout_);
  Reader rd{r};
  if (!rd.u8()) return std::nullopt;
  return rd.str();
}

std::string TcpStore::get(const std::string& key) {
  wait({key}, timeout_);
  auto v = try_get(key);
  ATOLL_CHECK(v.has_value(), "rendezvous store: key '{}' vanished", key);
  return *v;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::string m(1, char(kAdd));
  put_str(m, key);
  put_i64(m, delta);
  std::string r = request(m, timeout_);
  return Reader{r}.i64();
}

static std::string wait_msg(uint8_t op, const std::vector<std::string>& keys) {
  std::string m(1, char(op));
  put_u32(m, uint32_t(keys.size()));
  for (auto& k : keys) put_str(m, k);
  return m;
}

void TcpStore::wait(const std::vector<std::string>& keys, Millis timeout) {
  std::string m = wait_msg(kWait, keys);
  put_i64(m, timeout.count());
  std::string r = request(m, timeout);
  if (Reader{r}.u8()) return;
  std::string missing;
  for (auto& k : keys)
    if (!check({k})) missing += (missing.empty() ? "'" : ", '") + k + "'";
  fail("rendezvous store {}: timed out after {:.1f} s waiting for {} (the ranks that should set "
       "them have not started or have died)",
       address_, timeout.count() / 1000.0, missing);
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::string r = request(wait_msg(kCheck, keys), timeout_);
  return Reader{r}.u8() != 0;
}

void TcpStore::hello(int rank) {
  std::string m(1, char(kHello));
  put_i64(m, rank);
  request(m, timeout_);
}

void TcpStore::goodbye() { request(std::string(1, char(kBye)), timeout_); }

std::vector<int> TcpStore::dead_ranks() {
  std::string r = request(std::string(1, char(kDead)), timeout_);
  Reader rd{r};
  std::vector<int> out(rd.u32());
  for (auto& d : out) d = int(rd.i64());
  return out;
}

}  // namespace atl::comm
