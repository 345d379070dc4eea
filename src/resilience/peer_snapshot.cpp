#include "resilience/peer_snapshot.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/checksum.h"
#include "core/error.h"
#include "core/log.h"
#include "core/server_threads.h"
#include "resilience/line_socket.h"

namespace atl::resilience {

using Clock = std::chrono::steady_clock;
static double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// ---------------------------------------------------------------- holder

struct SnapshotHolder::Impl {
  int listen_fd = -1, port = 0;
  mutable std::mutex mu;
  std::map<int, PeerSnapshot> complete;
  int64_t received = 0, rejected = 0;
  bool stop = false;
  std::thread acceptor;
  ServerThreads conns;  // one per connection (a snapshot each), joined as they finish
  std::vector<int> conn_fds;

  void serve(int fd) {
    LineConn c(fd);
    std::string line;
    while (c.read_line(line)) {
      std::istringstream in(line);
      std::string kind;
      in >> kind;
      if (kind == "PUT") {
        int owner = -1;
        int64_t step = -1;
        uint64_t n = 0;
        uint32_t crc = 0;
        in >> owner >> step >> n >> crc;
        // The second buffer: the owner's complete snapshot stays untouched until this one is whole.
        std::string incoming;
        if (!in || !c.read_bytes(incoming, size_t(n), Millis(60000))) {
          std::lock_guard<std::mutex> lk(mu);
          ++rejected;
          break;  // cut mid-transfer (the owner died): keep the previous snapshot
        }
        if (crc32c(incoming) != crc) {
          {
            std::lock_guard<std::mutex> lk(mu);
            ++rejected;
          }
          if (!c.send_line(fmt::format("BAD crc32c mismatch for owner {} step {}", owner, step))) break;
          continue;
        }
        {
          std::lock_guard<std::mutex> lk(mu);
          PeerSnapshot& s = complete[owner];
          s.step = step;
          s.blob.swap(incoming);
          ++received;
        }
        if (!c.send_line(fmt::format("OK {}", step))) break;
      } else if (kind == "GET") {
        int owner = -1;
        in >> owner;
        std::string header, blob;
        {
          std::lock_guard<std::mutex> lk(mu);
          auto it = complete.find(owner);
          if (it == complete.end()) {
            header = "NONE";
          } else {
            blob = it->second.blob;
            header = fmt::format("SNAP {} {} {}", it->second.step, blob.size(), crc32c(blob));
          }
        }
        if (!c.send_line(header) || !c.send_bytes(blob.data(), blob.size())) break;
      } else {
        c.send_line("BAD unknown request '" + kind + "'");
      }
    }
    std::lock_guard<std::mutex> lk(mu);
    conn_fds.erase(std::remove(conn_fds.begin(), conn_fds.end(), c.fd()), conn_fds.end());
  }
};

SnapshotHolder::SnapshotHolder(const std::string& host, int port) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.port = port;
  I.listen_fd = listen_on(host, I.port);
  I.acceptor = accept_loop(I.listen_fd, I.mu, I.stop, [&I](int fd) {
    I.conn_fds.push_back(fd);
    I.conns.start([&I, fd] { I.serve(fd); });
  });
}

SnapshotHolder::~SnapshotHolder() {
  auto& I = *impl_;
  {
    std::lock_guard<std::mutex> lk(I.mu);
    I.stop = true;
    for (int fd : I.conn_fds) ::shutdown(fd, SHUT_RDWR);
  }
  ::shutdown(I.listen_fd, SHUT_RDWR);
  ::close(I.listen_fd);
  I.acceptor.join();
  I.conns.join_all();
}

int SnapshotHolder::port() const { return impl_->port; }

std::optional<PeerSnapshot> SnapshotHolder::get(int owner) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto it = impl_->complete.find(owner);
  if (it == impl_->complete.end()) return std::nullopt;
  return it->second;
}
int64_t SnapshotHolder::received() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->received;
}
int64_t SnapshotHolder::rejected() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->rejected;
}

// ---------------------------------------------------------------- sender

namespace {
enum class Buf { free, filling, ready, sending };
}

struct SnapshotSender::Impl {
  int owner = 0;
  std::function<std::string()> resolve;
  std::mutex mu;
  std::condition_variable cv;
  std::string buf[2];
  Buf state[2] = {Buf::free, Buf::free};
  int64_t step[2] = {-1, -1};
  // The copy job (one at a time: snapshot() ... fence()).
  bool job = false, job_done = true;
  int job_buf = -1;
  std::function<void(std::string&)> fill;
  bool stop = false;
  Stats st;
  std::thread copier, sender;
  LineConn conn;

  void copy_loop() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      cv.wait(lk, [&] { return stop || job; });
      if (stop) return;
      job = false;
      int b = job_buf;
      auto f = std::move(fill);
      lk.unlock();
      auto t0 = Clock::now();
      bool ok = true;
      try {
        f(buf[b]);  // state filling: nobody else touches it
      } catch (const std::exception& e) {
        log::warn("peer snapshot of {}: the copy failed: {}", owner, e.what());
        ok = false;
      }
      double ms = ms_since(t0);
      lk.lock();
      st.copy_ms = ms;
      if (ok) ++st.copied;
      state[b] = ok ? Buf::ready : Buf::free;
      job_done = true;
      cv.notify_all();
    }
  }

  bool send_one(int b) {
    const std::string& blob = buf[b];  // state sending: the copier never picks it
    uint32_t crc = crc32c(blob);
    if (!conn.open()) {
      std::string addr;
      try {
        addr = resolve();
      } catch (const std::exception& e) {
        log::debug("peer snapshot of {}: no holder address: {}", owner, e.what());
        return false;
      }
      auto colon = addr.rfind(':');
      if (colon == std::string::npos) return false;
      try {
        conn = LineConn(connect_to(addr.substr(0, colon), std::atoi(addr.c_str() + colon + 1), Millis(2000)));
      } catch (const std::exception& e) {
        log::debug("peer snapshot of {}: {}", owner, e.what());
        return false;
      }
    }
    std::string reply;
    bool ok = conn.send_line(fmt::format("PUT {} {} {} {}", owner, step[b], blob.size(), crc)) &&
              conn.send_bytes(blob.data(), blob.size()) && conn.read_line(reply, Millis(30000)) &&
              reply.rfind("OK ", 0) == 0;
    if (!ok) conn.close();
    return ok;
  }

  void send_loop() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      cv.wait(lk, [&] { return stop || state[0] == Buf::ready || state[1] == Buf::ready; });
      if (stop) return;
      int b = state[0] == Buf::ready && (state[1] != Buf::ready || step[0] > step[1]) ? 0 : 1;
      if (step[b] <= st.acked_step) {  // a retry overtaken by a newer snapshot that got through
        state[b] = Buf::free;
        continue;
      }
      state[b] = Buf::sending;
      lk.unlock();
      auto t0 = Clock::now();
      bool ok = send_one(b);
      double ms = ms_since(t0);
      lk.lock();
      if (ok) {
        ++st.sent;
        st.send_ms = ms;
        st.acked_step = std::max(st.acked_step, step[b]);
        state[b] = Buf::free;
      } else {
        ++st.failures;
        // Retry it unless a newer one is waiting; the holder may be coming back at a new address.
        bool newer = state[1 - b] == Buf::ready && step[1 - b] > step[b];
        state[b] = newer ? Buf::free : Buf::ready;
        cv.wait_for(lk, Millis(50), [&] { return stop; });
      }
      cv.notify_all();
    }
  }
};

SnapshotSender::SnapshotSender(int owner, std::function<std::string()> resolve_holder)
    : impl_(std::make_unique<Impl>()) {
  impl_->owner = owner;
  impl_->resolve = std::move(resolve_holder);
  impl_->copier = std::thread([I = impl_.get()] { I->copy_loop(); });
  impl_->sender = std::thread([I = impl_.get()] { I->send_loop(); });
}

SnapshotSender::~SnapshotSender() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->conn.shutdown();
  impl_->copier.join();
  impl_->sender.join();
}

void SnapshotSender::snapshot(int64_t step, std::vector<Part> parts) {
  snapshot_with(step, [p = std::move(parts)](std::string& out) {
    size_t total = 0;
    for (auto& [ptr, n] : p) total += n;
    out.resize(total);
    size_t off = 0;
    for (auto& [ptr, n] : p) {
      if (n) std::memcpy(out.data() + off, ptr, n);
      off += n;
    }
  });
}

void SnapshotSender::snapshot_with(int64_t step, std::function<void(std::string&)> fill) {
  auto& I = *impl_;
  std::lock_guard<std::mutex> lk(I.mu);
  if (!I.job_done) {
    ++I.st.superseded;
    return;
  }
  // Never the buffer being sent; a ready one that was not sent yet is older: superseded.
  int b;
  if (I.state[0] == Buf::sending) b = 1;
  else if (I.state[1] == Buf::sending) b = 0;
  else if (I.state[0] == Buf::free) b = 0;
  else if (I.state[1] == Buf::free) b = 1;
  else b = I.step[0] < I.step[1] ? 0 : 1;
  if (I.state[b] == Buf::ready) ++I.st.superseded;
  I.state[b] = Buf::filling;
  I.step[b] = step;
  I.job_buf = b;
  I.fill = std::move(fill);
  I.job = true;
  I.job_done = false;
  I.cv.notify_all();
}

double SnapshotSender::fence() {
  auto& I = *impl_;
  auto t0 = Clock::now();
  std::unique_lock<std::mutex> lk(I.mu);
  I.cv.wait(lk, [&] { return I.job_done; });
  double ms = ms_since(t0);
  I.st.fence_wait_ms += ms;
  return ms;
}

bool SnapshotSender::wait_acked(int64_t step, std::chrono::milliseconds within) {
  std::unique_lock<std::mutex> lk(impl_->mu);
  return impl_->cv.wait_for(lk, within, [&] { return impl_->st.acked_step >= step; });
}

SnapshotSender::Stats SnapshotSender::stats() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->st;
}

// ---------------------------------------------------------------- fetch

std::optional<PeerSnapshot> fetch_snapshot(const std::string& host, int port, int owner, Millis within) {
  LineConn c(connect_to(host, port, within));
  std::string header;
  ATOLL_CHECK(c.send_line(fmt::format("GET {}", owner)) && c.read_line(header, within),
              "peer snapshot holder {}:{} did not answer for owner {}", host, port, owner);
  if (header == "NONE") return std::nullopt;
  std::istringstream in(header);
  std::string kind;
  PeerSnapshot s;
  uint64_t n = 0;
  uint32_t crc = 0;
  in >> kind >> s.step >> n >> crc;
  ATOLL_CHECK(kind == "SNAP" && in, "peer snapshot holder {}:{}: bad answer '{}'", host, port, header);
  ATOLL_CHECK(c.read_bytes(s.blob, size_t(n), within), "peer snapshot holder {}:{}: snapshot of owner {} cut short",
              host, port, owner);
  ATOLL_CHECK(crc32c(s.blob) == crc, "peer snapshot of owner {} from {}:{}: crc32c mismatch", owner, host, port);
  return s;
}

}  // namespace atl::resilience
