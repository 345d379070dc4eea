#include "resilience/coded_exchange.h"

#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/server_threads.h"
#include "resilience/line_socket.h"

namespace atl::resilience {

namespace {
constexpr size_t kMaxQueued = 64;  // frames per peer; older ones go when a peer stops reading
}

struct CodedExchange::Impl {
  int rank = 0, size = 1, listen_fd = -1;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::map<int64_t, Messages> box;
  int64_t floor = 0;  // steps below are forgotten
  // Outgoing, one per peer.
  struct Peer {
    LineConn conn;
    std::deque<std::shared_ptr<std::string>> q;
    std::condition_variable cv;
    std::thread sender;
    bool closing = false;
  };
  std::vector<std::unique_ptr<Peer>> peers;
  std::vector<int> in_fds;
  ServerThreads readers;
  std::thread acceptor;

  void deliver(int64_t step, int from, std::vector<float> v) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (step < floor) return;
      box[step][from] = std::move(v);
    }
    cv.notify_all();
  }
  void read_loop(int fd) {
    LineConn c(fd);
    std::string line, bytes;
    while (c.read_line(line)) {
      std::istringstream in(line);
      char tag = 0;
      int64_t step = 0, n = 0;
      int from = -1;
      if (!(in >> tag >> step >> from >> n) || tag != 'M' || n < 0) return;
      bytes.clear();
      if (!c.read_bytes(bytes, size_t(n) * sizeof(float))) return;
      std::vector<float> v(static_cast<size_t>(n));
      std::memcpy(v.data(), bytes.data(), bytes.size());
      deliver(step, from, std::move(v));
    }
  }
  void send_loop(Peer& p) {
    for (;;) {
      std::shared_ptr<std::string> f;
      {
        std::unique_lock<std::mutex> lk(mu);
        p.cv.wait(lk, [&] { return p.closing || !p.q.empty(); });
        if (p.q.empty()) return;
        f = p.q.front();
        p.q.pop_front();
      }
      if (!p.conn.send_bytes(f->data(), f->size())) return;  // the peer has gone
    }
  }
};

CodedExchange::CodedExchange(comm::Communicator& comm, const std::string& host) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.rank = comm.rank();
  I.size = comm.size();
  int port = 0;
  I.listen_fd = listen_on(host, port);
  I.acceptor = accept_loop(I.listen_fd, I.mu, I.stop, [&I](int fd) {
    I.in_fds.push_back(fd);
    I.readers.start([&I, fd] { I.read_loop(fd); });
  });
  Tensor ports = Tensor::zeros({int64_t(I.size)}, DType::i64), mine = Tensor::zeros({1}, DType::i64);
  mine.data<int64_t>()[0] = port;
  comm.all_gather(mine, ports);
  I.peers.resize(size_t(I.size));
  for (int r = 0; r < I.size; ++r) {
    if (r == I.rank) continue;
    auto p = std::make_unique<Impl::Peer>();
    p->conn = LineConn(connect_to(host, int(ports.data<int64_t>()[r]), Millis(30000)));
    Impl::Peer* raw = p.get();
    p->sender = std::thread([&I, raw] { I.send_loop(*raw); });
    I.peers[size_t(r)] = std::move(p);
  }
  comm.barrier();  // every connection is up before the first message
}

CodedExchange::~CodedExchange() {
  auto& I = *impl_;
  {
    std::lock_guard<std::mutex> lk(I.mu);
    for (auto& p : I.peers)
      if (p) p->closing = true;
  }
  for (auto& p : I.peers)
    if (p) p->cv.notify_all();
  // Senders drain their queues; one blocked on a stopped peer is cut after a while.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& p : I.peers) {
    if (!p) continue;
    for (;;) {
      {
        std::lock_guard<std::mutex> lk(I.mu);
        if (p->q.empty()) break;
      }
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  for (auto& p : I.peers)
    if (p) p->conn.shutdown();
  for (auto& p : I.peers)
    if (p && p->sender.joinable()) p->sender.join();
  {
    std::lock_guard<std::mutex> lk(I.mu);
    I.stop = true;
    for (int fd : I.in_fds) ::shutdown(fd, SHUT_RDWR);
  }
  I.cv.notify_all();
  ::shutdown(I.listen_fd, SHUT_RDWR);
  ::close(I.listen_fd);
  I.acceptor.join();
  I.readers.join_all();
}

int CodedExchange::rank() const { return impl_->rank; }
int CodedExchange::size() const { return impl_->size; }

void CodedExchange::post(int64_t step, std::vector<float> msg) {
  auto& I = *impl_;
  auto frame = std::make_shared<std::string>(fmt::format("M {} {} {}\n", step, I.rank, msg.size()));
  frame->append(reinterpret_cast<const char*>(msg.data()), msg.size() * sizeof(float));
  {
    std::lock_guard<std::mutex> lk(I.mu);
    for (auto& p : I.peers) {
      if (!p) continue;
      p->q.push_back(frame);
      while (p->q.size() > kMaxQueued) p->q.pop_front();
    }
  }
  for (auto& p : I.peers)
    if (p) p->cv.notify_one();
  I.deliver(step, I.rank, std::move(msg));
}

CodedExchange::Messages CodedExchange::collect(int64_t step, int k, std::chrono::milliseconds timeout) {
  auto& I = *impl_;
  std::unique_lock<std::mutex> lk(I.mu);
  bool ok = I.cv.wait_for(lk, timeout, [&] { return int(I.box[step].size()) >= k; });
  if (!ok) {
    std::string have;
    for (auto& [r, v] : I.box[step]) have += fmt::format(" {}", r);
    fail("coded exchange: step {}: {} of the {} messages needed came within {} ms (from ranks:{})", step,
         I.box[step].size(), k, timeout.count(), have.empty() ? " none" : have);
  }
  return I.box[step];
}

CodedExchange::Messages CodedExchange::peek(int64_t step) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto it = impl_->box.find(step);
  return it == impl_->box.end() ? Messages{} : it->second;
}

void CodedExchange::forget_before(int64_t step) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->floor = std::max(impl_->floor, step);
  impl_->box.erase(impl_->box.begin(), impl_->box.lower_bound(step));
}

}  // namespace atl::resilience
