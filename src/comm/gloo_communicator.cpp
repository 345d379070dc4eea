// Gloo backend: Gloo's TCP transport and collective algorithms, rendezvous through our TCP store
// (this Gloo ships file, hash and Redis stores but no TCP one), dead-rank diagnosis through the
// store's lifelines.
#ifdef ATOLL_HAVE_GLOO
#include "comm/gloo_communicator.h"

#include <arpa/inet.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <cstring>
#include <thread>

#include "comm/network_partition.h"
#include "core/log.h"

namespace atl::comm {

struct GlooProcess {
  std::unique_ptr<TcpStoreServer> server;  // when this process hosts the store (rank 0)
  std::unique_ptr<TcpStore> store;
  std::unique_ptr<TcpStore> lifeline;
  std::shared_ptr<gloo::transport::Device> device;
  int world_rank = 0, world_size = 1;
  std::string exit_prefix;
  Millis timeout{0};
  bool clean = true;
  bool store_on_rank0 = false;

  // Heartbeat: the operation each communicator last started, posted to the store every 200 ms
  // by a background thread (never on the collective's path), so that when a peer stops
  // answering the others can tell which rank is behind.
  std::mutex hb_mu;
  std::condition_variable hb_cv;
  bool hb_stop = false;
  std::map<std::string, std::string> progress, posted;
  std::thread heartbeat;

  void start_heartbeat() {
    heartbeat = std::thread([this] {
      std::unique_lock<std::mutex> lk(hb_mu);
      while (!hb_stop) {
        hb_cv.wait_for(lk, Millis(200));
        std::vector<std::pair<std::string, std::string>> todo;
        for (auto& [k, v] : progress)
          if (posted[k] != v) todo.push_back({k, v});
        lk.unlock();
        if (this_process_partitioned()) todo.clear();  // the store is out of reach too
        try {
          for (auto& [k, v] : todo) lifeline->set(k, v);
        } catch (const std::exception&) {
          return;  // the store is gone; the collectives will report it
        }
        lk.lock();
        for (auto& [k, v] : todo) posted[k] = v;
      }
    });
  }
  void note_progress(const std::string& key, std::string value) {
    std::lock_guard<std::mutex> lk(hb_mu);
    progress[key] = std::move(value);
  }

  ~GlooProcess() {
    {
      std::lock_guard<std::mutex> lk(hb_mu);
      hb_stop = true;
    }
    hb_cv.notify_all();
    if (heartbeat.joinable()) heartbeat.join();
    // Tell the store we leave on purpose; the host then waits (bounded) for everyone else to
    // leave too, so that no rank loses the store in the middle of its own shutdown.
    try {
      if (lifeline) lifeline->goodbye();
      if (store) store->set(exit_prefix + std::to_string(world_rank), "1");
      if (server && store) {
        // After a failure the others are failing too; give them a moment to read the store
        // (their diagnosis uses it), but do not wait for ranks that may never come.
        auto until = std::chrono::steady_clock::now() + std::min(timeout, Millis(clean ? 30000 : 3000));
        for (;;) {
          auto dead = store->dead_ranks();
          int gone = 0;
          for (int r = 0; r < world_size; ++r)
            if (std::count(dead.begin(), dead.end(), r) ||
                store->check({exit_prefix + std::to_string(r)}))
              ++gone;
          if (gone == world_size || std::chrono::steady_clock::now() > until) break;
          std::this_thread::sleep_for(Millis(20));
        }
      }
    } catch (const std::exception&) {
      // The store host is gone; nothing left to coordinate with.
    }
    lifeline.reset();
    store.reset();
    server.reset();
  }
};

namespace {

// Gloo's rendezvous goes through this adapter, so its keys live in our store under a prefix.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  StoreAdapter(TcpStore& s, std::string prefix) : s_(s), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::vector<char>& data) override {
    s_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    std::string v = s_.get(prefix_ + key);
    return {v.begin(), v.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, s_.timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& t) override {
    std::vector<std::string> pk;
    for (auto& k : keys) pk.push_back(prefix_ + k);
    s_.wait(pk, t);
  }

 private:
  TcpStore& s_;
  std::string prefix_;
};

// The local address the kernel would use to reach the store: right on one host (loopback) and
// in network namespaces alike, without guessing interface names.
std::string local_ip_towards(const std::string& host, int port) {
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return "127.0.0.1";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port ? port : 9));
  std::string ip = "127.0.0.1";
  bool resolved = inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1;
  if (!resolved) {  // a host name: MASTER_ADDR=node0
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &res) == 0 && res) {
      a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
      resolved = true;
      freeaddrinfo(res);
    }
  }
  if (resolved && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    socklen_t len = sizeof a;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      char buf[INET_ADDRSTRLEN];
      if (inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf)) ip = buf;
    }
  }
  ::close(fd);
  return ip;
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);
template <typename T>
ReduceFn reduce_fn(ReduceOp op) {
  return op == ReduceOp::max ? ReduceFn(&gloo::max<T>) : ReduceFn(&gloo::sum<T>);
}

constexpr uint8_t kP2PSlotPrefix = 0x42;

}  // namespace

std::unique_ptr<Communicator> GlooCommunicator::create(const DistEnv& env, Millis timeout) {
  ATOLL_CHECK(env.store_port > 0,
              "the Gloo backend needs MASTER_ADDR and MASTER_PORT (set by `atoll launch`)");
  // Gloo's TCP pairs write without MSG_NOSIGNAL: when a peer dies, the next write to it raises
  // SIGPIPE, which would kill this rank silently (exit 141) before the collective fails with an
  // error naming the dead rank. Ignored, the write returns EPIPE and the error path reports it.
  ::signal(SIGPIPE, SIG_IGN);
  auto proc = std::make_shared<GlooProcess>();
  proc->world_rank = env.rank;
  proc->world_size = env.world_size;
  proc->timeout = timeout;
  proc->store_on_rank0 = !env.store_hosted_externally;
  if (env.rank == 0 && !env.store_hosted_externally)
    proc->server = std::make_unique<TcpStoreServer>("0.0.0.0", env.store_port);
  proc->store = std::make_unique<TcpStore>(env.store_addr, env.store_port, timeout);
  proc->lifeline = std::make_unique<TcpStore>(env.store_addr, env.store_port, timeout);
  proc->lifeline->hello(env.rank);
  // Each world communicator this process creates gets its own key space; ranks create them in
  // the same order, so the counters agree.
  int64_t gen = proc->store->add("gloo/generation/" + std::to_string(env.rank), 1);
  std::string prefix = fmt::format("gloo/{}/", gen);
  proc->exit_prefix = prefix + "exit/";
  gloo::transport::tcp::attr attr;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"))
    attr.iface = ifname;
  else
    attr.hostname = local_ip_towards(env.store_addr, env.store_port);
  proc->device = gloo::transport::tcp::CreateDevice(attr);
  proc->start_heartbeat();
  return std::make_unique<GlooCommunicator>(proc, env.rank, env.world_size, std::vector<int>{}, prefix,
                                            timeout);
}

std::unique_ptr<Communicator> GlooCommunicator::create_group(const std::string& store_addr, int store_port,
                                                            int rank, std::vector<int> world_ranks,
                                                            const std::string& prefix, Millis timeout,
                                                            Millis connect_within) {
  ::signal(SIGPIPE, SIG_IGN);  // as in create(): a dead peer must give EPIPE, not kill us
  auto proc = std::make_shared<GlooProcess>();
  proc->world_rank = world_ranks.at(size_t(rank));
  proc->world_size = int(world_ranks.size());
  proc->timeout = timeout;
  proc->store = std::make_unique<TcpStore>(store_addr, store_port, timeout, connect_within);
  proc->exit_prefix = prefix + "exit/";
  gloo::transport::tcp::attr attr;
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"))
    attr.iface = ifname;
  else
    attr.hostname = local_ip_towards(store_addr, store_port);
  proc->device = gloo::transport::tcp::CreateDevice(attr);
  int size = int(world_ranks.size());
  return std::make_unique<GlooCommunicator>(proc, rank, size, std::move(world_ranks), prefix, timeout,
                                            connect_within);
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<GlooProcess> proc, int rank, int size,
                                   std::vector<int> world_ranks, const std::string& prefix,
                                   Millis timeout, Millis connect_within)
    : Communicator(rank, size, std::move(world_ranks), timeout), proc_(std::move(proc)), prefix_(prefix) {
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  // Setting up the mesh has its own, shorter deadline than the collectives (tcp_store.h).
  ctx->setTimeout(connect_within.count() >= 0 ? connect_within : connect_timeout(timeout));
  StoreAdapter st(*proc_->store, prefix_ + "mesh/");
  try {
    ctx->connectFullMesh(st, proc_->device);
    ctx->setTimeout(timeout);
  } catch (const std::exception& e) {
    proc_->clean = false;
    // Gloo's rendezvous key for rank r is its rank number: name the ranks that never arrived.
    std::string missing;
    try {
      for (int r = 0; r < size; ++r)
        if (!proc_->store->check({fmt::format("{}mesh/{}", prefix_, r)}))
          missing += fmt::format("{}{}", missing.empty() ? "" : ", ", world_ranks_of(r));
    } catch (const std::exception&) {
    }
    fail("gloo rendezvous of rank {} of {} failed{}: {}", world_ranks_of(rank), size,
         missing.empty() ? "" : fmt::format(" (rank {} never joined)", missing), e.what());
  }
  ctx_ = ctx;
  start_worker();
}

GlooCommunicator::~GlooCommunicator() {
  stop_worker();
  ctx_.reset();
}

int GlooCommunicator::world_ranks_of(int r) const { return world_ranks()[size_t(r)]; }

void GlooCommunicator::run_all_reduce(const Tensor& t, ReduceOp op) {
  if (t.numel() == 0 || size() == 1) return;
  gloo::AllreduceOptions o(ctx_);
  o.setTag(tag());
  o.setTimeout(remaining());
  switch (t.dtype()) {
    case DType::f32:
      o.setOutput(t.data<float>(), size_t(t.numel()));
      o.setReduceFunction(reduce_fn<float>(op));
      break;
    case DType::i32:
      o.setOutput(t.data<int32_t>(), size_t(t.numel()));
      o.setReduceFunction(reduce_fn<int32_t>(op));
      break;
    case DType::i64:
      o.setOutput(t.data<int64_t>(), size_t(t.numel()));
      o.setReduceFunction(reduce_fn<int64_t>(op));
      break;
    default: fail("gloo all_reduce: dtype {} reaches the backend unwidened", dtype_name(t.dtype()));
  }
  gloo::allreduce(o);
}

void GlooCommunicator::run_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  ring_reduce_scatter(ctx_, in, out, op, tag(), remaining());
}

void GlooCommunicator::run_all_gather(const Tensor& in, const Tensor& out) {
  if (in.nbytes() == 0) return;
  if (size() == 1) {
    std::memcpy(out.raw(), in.raw(), in.nbytes());
    return;
  }
  gloo::AllgatherOptions o(ctx_);
  o.setTag(tag());
  o.setTimeout(remaining());
  // In place when `in` is already chunk `rank` of `out` (ZeRO's own shard inside the full
  // parameter buffer): Gloo then starts from the output as it is, so no staging chunk is needed.
  if (in.raw() != static_cast<char*>(out.raw()) + size_t(rank()) * in.nbytes())
    o.setInput(static_cast<char*>(in.raw()), in.nbytes());
  o.setOutput(static_cast<char*>(out.raw()), out.nbytes());
  gloo::allgather(o);
}

void GlooCommunicator::run_broadcast(const Tensor& t, int root) {
  if (t.nbytes() == 0 || size() == 1) return;
  gloo::BroadcastOptions o(ctx_);
  o.setTag(tag());
  o.setTimeout(remaining());
  o.setRoot(root);
  o.setOutput(static_cast<char*>(t.raw()), t.nbytes());
  gloo::broadcast(o);
}

void GlooCommunicator::run_all_to_all(const Tensor& in, const Tensor& out) {
  if (in.nbytes() == 0) return;
  if (size() == 1) {
    std::memcpy(out.raw(), in.raw(), in.nbytes());
    return;
  }
  gloo::AlltoallOptions o(ctx_);
  o.setTag(tag());
  o.setTimeout(remaining());
  o.setInput(static_cast<char*>(in.raw()), in.nbytes());
  o.setOutput(static_cast<char*>(out.raw()), out.nbytes());
  gloo::alltoall(o);
}

void GlooCommunicator::run_barrier() {
  if (size() == 1) return;
  gloo::BarrierOptions o(ctx_);
  o.setTag(tag());
  o.setTimeout(remaining());
  gloo::barrier(o);
}

std::function<void()> GlooCommunicator::post_send(const Tensor& t, int peer, int tag) {
  std::shared_ptr<gloo::transport::UnboundBuffer> buf = ctx_->createUnboundBuffer(t.raw(), t.nbytes());
  buf->send(peer, gloo::Slot::build(kP2PSlotPrefix, uint32_t(tag)));
  Millis to = timeout();
  return [buf, to, peer] {
    ATOLL_CHECK(buf->waitSend(to), "send to rank {} was aborted", peer);
  };
}

std::function<void()> GlooCommunicator::post_recv(const Tensor& t, int peer, int tag) {
  std::shared_ptr<gloo::transport::UnboundBuffer> buf = ctx_->createUnboundBuffer(t.raw(), t.nbytes());
  buf->recv(peer, gloo::Slot::build(kP2PSlotPrefix, uint32_t(tag)));
  Millis to = timeout();
  return [buf, to, peer] {
    ATOLL_CHECK(buf->waitRecv(to), "receive from rank {} was aborted", peer);
  };
}

std::unique_ptr<Communicator> GlooCommunicator::run_split(const std::vector<int>& members,
                                                          int new_rank, int color) {
  int n = ++splits_;
  if (members.empty()) return nullptr;
  std::vector<int> wr;
  for (int m : members) wr.push_back(world_ranks()[size_t(m)]);
  return std::make_unique<GlooCommunicator>(proc_, new_rank, int(members.size()), wr,
                                            fmt::format("{}split{}/color{}/", prefix_, n, color),
                                            timeout());
}

void GlooCommunicator::on_op_start(const std::string& name, uint64_t seq) {
  current_op_ = name;
  proc_->note_progress(fmt::format("{}progress/{}", prefix_, rank()), fmt::format("{} {}", seq, name));
}

bool gloo_fail_pair(gloo::transport::Pair* p, const std::string& msg);  // gloo_abort.cpp

void GlooCommunicator::run_abort() {
  if (!ctx_) return;
  for (int r = 0; r < size(); ++r) {
    if (r == rank()) continue;
    // Failing the pair wakes the operation blocked on it (close() alone would not).
    gloo_fail_pair(ctx_->getPair(r).get(), "aborted by the fault-tolerance layer");
  }
}

// The rank's own failure report for `atoll launch` (issue 14): the world ranks its failed
// collective blames, under launch/report/<world rank> in the launcher's store, so that the
// launcher names the rank the job failed because of, not the first one to exit (a peer that timed
// out waiting for it exits before the launcher tears the culprit down). The first report stays.
void GlooCommunicator::post_failure_report(const std::vector<int>& blamed, const std::string& why) {
  if (proc_->store_on_rank0 || !proc_->lifeline) return;  // no launcher's store to read it
  if (this_process_partitioned()) return;                  // a partitioned rank cannot reach it
  try {
    const std::string key = fmt::format("launch/report/{}", proc_->world_rank);
    std::string ranks;
    for (int r : blamed) ranks += fmt::format("{}{}", ranks.empty() ? "" : ",", r);
    if (!proc_->lifeline->check({key})) proc_->lifeline->set(key, ranks + ";" + why);
  } catch (const std::exception&) {
  }
}

std::string GlooCommunicator::diagnose() {
  std::vector<int> blamed;
  std::string why = diagnose_into(blamed);
  post_failure_report(blamed, why);
  return why;
}

std::string GlooCommunicator::diagnose_into(std::vector<int>& blamed) {
  proc_->clean = false;
  // A group (create_group) has no lifelines to read; its owner knows who failed (the lighthouse).
  if (!proc_->lifeline) return "";
  // Partitioned (comm/network_partition.h): the store would not answer either; waiting for it to
  // say so would only add its timeout.
  if (this_process_partitioned()) return "neither the peers nor the rendezvous store answer (a network partition?)";
  const auto& wr = world_ranks();
  try {
    // The transport often notices a death a moment before the store does.
    for (int i = 0; i < 20; ++i) {
      std::vector<int> dead_here;
      for (int d : proc_->store->dead_ranks())
        if (std::count(wr.begin(), wr.end(), d)) dead_here.push_back(d);
      if (!dead_here.empty()) {
        blamed = dead_here;
        std::string names;
        for (int d : dead_here) names += (names.empty() ? "" : ", ") + std::to_string(d);
        return fmt::format("rank {} died (its connection to the rendezvous store closed)", names);
      }
      std::this_thread::sleep_for(Millis(50));
    }
  } catch (const Error& e) {
    return fmt::format("{}; {}", e.what(),
                       proc_->store_on_rank0 ? "rank 0, which hosts the store, has probably died"
                                             : "`atoll launch` on node 0, which hosts the store, has exited");
  }
  // Nobody died: find the ranks whose last started operation is older than ours.
  std::string behind;
  try {
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      auto v = proc_->store->try_get(fmt::format("{}progress/{}", prefix_, r));
      uint64_t seq = v ? std::strtoull(v->c_str(), nullptr, 10) : 0;
      if (seq < op_seq()) {
        blamed.push_back(world_ranks_of(r));
        behind += fmt::format("{}rank {} (last started: {})", behind.empty() ? "" : ", ", world_ranks_of(r),
                              v ? v->substr(v->find(' ') + 1) : std::string("nothing"));
      }
    }
  } catch (const std::exception&) {
  }
  if (!behind.empty())
    return fmt::format("{} stopped answering: not in {} after {:.1f} s", behind, current_op_,
                       timeout().count() / 1000.0);
  return fmt::format("no rank is known to have died; a peer stopped answering within {:.1f} s",
                     timeout().count() / 1000.0);
}

}  // namespace atl::comm
#endif
