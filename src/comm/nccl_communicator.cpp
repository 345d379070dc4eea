// NCCL backend. API facts from the NCCL user guide: a non-blocking communicator
// (ncclConfig_t.blocking = 0) returns ncclInProgress from its calls and is polled with
// ncclCommGetAsyncError until the state leaves ncclInProgress; a hung communicator is torn down
// with ncclCommAbort; ncclCommFinalize + ncclCommDestroy is the clean shutdown; sends and receives
// inside one ncclGroupStart/ncclGroupEnd progress together, which is what makes an exchange (and
// all_to_all) deadlock-free. Completion on the GPU is observed with cudaStreamQuery/cudaEventQuery,
// so no thread ever blocks inside CUDA past the operation's deadline.
#ifdef ATOLL_HAVE_NCCL
#include "comm/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <thread>

#include "comm/tcp_store.h"
#include "kernels/cuda/device.h"

namespace atl::comm {

using Clock = std::chrono::steady_clock;

struct NcclProcess {
  std::unique_ptr<TcpStoreServer> server;  // rank 0, unless `atoll launch` hosts the store
  std::unique_ptr<TcpStore> store;
};

struct NcclCommunicator::P2p {
  bool is_send = false;
  Staged buf;
  int peer = 0;
  bool posted = false;
  cudaEvent_t done = nullptr;  // recorded on the stream after the group that carries it
};

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
  }
  fail("nccl: unsupported dtype");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;  // the base class sends sum + scale today; kept for CUDA
    case ReduceOp::max: return ncclMax;
  }
  fail("nccl: unsupported reduction");
}

std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  return fmt::format("{} ({}){}{}", ncclGetErrorString(r), int(r), last && *last ? ": " : "",
                     last ? last : "");
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  fail("CUDA {} failed: {}", what, cuda::error_string(int(e)));
}

double secs(Millis m) { return m.count() / 1000.0; }

// Polls a communicator being created (init or split) until it is ready; aborts it on error or at
// the deadline.
void wait_ready(ncclComm_t comm, ncclResult_t issued, const char* call, Clock::time_point deadline,
                Millis timeout) {
  if (issued != ncclSuccess && issued != ncclInProgress) {
    std::string msg = nccl_error(issued, comm);
    if (comm) ncclCommAbort(comm);
    fail("{} failed: {}", call, msg);
  }
  for (;;) {
    ncclResult_t st = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm, &st);
    if (q != ncclSuccess) st = q;
    if (st == ncclSuccess) return;
    if (st != ncclInProgress) {
      std::string msg = nccl_error(st, comm);
      ncclCommAbort(comm);
      fail("{} failed: {}", call, msg);
    }
    if (Clock::now() > deadline) {
      ncclCommAbort(comm);
      fail("{} did not finish within the timeout of {:.1f} s (a rank did not join, or died); the "
           "NCCL communicator was aborted",
           call, secs(timeout));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

}  // namespace

std::unique_ptr<Communicator> NcclCommunicator::create(const DistEnv& env, Millis timeout) {
  cuda::DeviceQuery q = cuda::query_devices();
  ATOLL_CHECK(q.count > 0, "backend 'nccl' needs a CUDA device, but none is visible to rank {}: {}",
              env.rank, q.reason);
  ATOLL_CHECK(env.local_rank < q.count,
              "backend 'nccl': rank {} is local rank {} on its node but only {} CUDA device(s) are "
              "visible; NCCL needs one GPU per rank (two ranks of one communicator may not share "
              "a GPU)",
              env.rank, env.local_rank, q.count);
  const int dev = env.local_rank;
  cuda::init(dev);

  auto proc = std::make_shared<NcclProcess>();
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (env.world_size == 1) {
    ncclResult_t r = ncclGetUniqueId(&id);
    ATOLL_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: {}", nccl_error(r, nullptr));
  } else {
    ATOLL_CHECK(env.store_port > 0,
                "backend 'nccl' with WORLD_SIZE={} needs a rendezvous: set MASTER_ADDR and "
                "MASTER_PORT (or run under `atoll launch`)",
                env.world_size);
    if (env.rank == 0 && !env.store_hosted_externally)
      proc->server = std::make_unique<TcpStoreServer>("0.0.0.0", env.store_port);
    proc->store = std::make_unique<TcpStore>(env.store_addr, env.store_port, timeout);
    // Each rank counts the NCCL worlds it has created, so a job that creates several gets a fresh
    // id for each (ranks create them in the same order).
    int64_t gen = proc->store->add(fmt::format("nccl/generation/{}", env.rank), 1);
    std::string key = fmt::format("nccl/{}/unique_id", gen);
    if (env.rank == 0) {
      ncclResult_t r = ncclGetUniqueId(&id);
      ATOLL_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: {}", nccl_error(r, nullptr));
      proc->store->set(key, std::string(reinterpret_cast<const char*>(&id), sizeof id));
    } else {
      std::string v = proc->store->get(key);
      ATOLL_CHECK(v.size() == sizeof id, "nccl: the unique id in the store has {} bytes, expected {}",
                  v.size(), sizeof id);
      std::memcpy(&id, v.data(), sizeof id);
    }
  }
  ncclConfig_t cfg = nonblocking_config();
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, env.world_size, id, env.rank, &cfg);
  wait_ready(comm, r, "ncclCommInitRankConfig", Clock::now() + timeout, timeout);
  return std::make_unique<NcclCommunicator>(proc, comm, dev, env.rank, env.world_size,
                                            std::vector<int>{}, timeout);
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclProcess> proc, ncclComm_t comm, int device,
                                   int rank, int size, std::vector<int> world_ranks, Millis timeout)
    : Communicator(rank, size, std::move(world_ranks), timeout),
      proc_(std::move(proc)),
      comm_(comm),
      device_(device) {
  use_device();
  cudaStream_t s = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  stream_ = s;
  barrier_buf_ = Tensor::empty({1}, DType::f32, Device::cuda(device_));
  start_worker();
}

NcclCommunicator::~NcclCommunicator() {
  stop_worker();
  std::lock_guard<std::mutex> lk(nccl_mu_);
  int prev = 0;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  for (auto& p : pending_)
    if (p->done) cudaEventDestroy(p->done);
  pending_.clear();
  if (!aborted_ && comm_) {
    // Clean shutdown: finalize (flushes outstanding work), poll, destroy. A peer that is gone
    // makes finalize hang, so it gets the timeout and then an abort.
    ncclResult_t r = ncclCommFinalize(comm_);
    auto deadline = Clock::now() + timeout();
    ncclResult_t st = r;
    while (st == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess) break;
    }
    if (st == ncclSuccess)
      ncclCommDestroy(comm_);
    else
      ncclCommAbort(comm_);
  }
  comm_ = nullptr;
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  cudaSetDevice(prev);
}

void NcclCommunicator::use_device() { cuda_ok(cudaSetDevice(device_), "cudaSetDevice"); }

NcclCommunicator::Staged NcclCommunicator::stage(const Tensor& t, bool read) {
  if (!t.device().is_cpu()) {
    ATOLL_CHECK(t.device().index == device_,
                "nccl: tensor is on {} but this rank's communicator uses cuda:{}", t.device().str(),
                device_);
    ATOLL_CHECK(t.is_contiguous(), "nccl: tensor {} is not contiguous", shape_str(t.shape()));
    return {t, Tensor()};
  }
  Staged s{Tensor::empty(t.shape(), t.dtype(), Device::cuda(device_)), t};
  if (read) cuda::copy(s.dev, t);
  return s;
}

void NcclCommunicator::fail_nccl(ncclResult_t r, const char* call) {
  std::string msg = nccl_error(r, comm_);
  abort_locked();
  fail("{} failed: {}", call, msg);
}

void NcclCommunicator::fail_timeout(const char* what, Clock::time_point) {
  abort_locked();
  fail("{} did not complete within the timeout of {:.1f} s (a peer is dead, stuck, or never "
       "issued the matching operation); the NCCL communicator was aborted",
       what, secs(timeout()));
}

void NcclCommunicator::abort_locked() {
  if (!aborted_ && comm_) ncclCommAbort(comm_);
  aborted_ = true;
}

void NcclCommunicator::wait_enqueued(ncclResult_t issued, const char* call,
                                     Clock::time_point deadline) {
  if (issued != ncclSuccess && issued != ncclInProgress) fail_nccl(issued, call);
  ncclResult_t st = issued;
  while (st == ncclInProgress) {
    if (Clock::now() > deadline) fail_timeout(call, deadline);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    ncclResult_t q = ncclCommGetAsyncError(comm_, &st);
    if (q != ncclSuccess) st = q;
  }
  if (st != ncclSuccess) fail_nccl(st, call);
}

// Waits for an event on the stream while watching the communicator's asynchronous error (a peer
// failure surfaces there, not on the stream).
void NcclCommunicator::wait_stream_event(void* event, const char* what, Clock::time_point deadline) {
  auto ev = static_cast<cudaEvent_t>(event);
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(nccl_mu_);
      ATOLL_CHECK(!aborted_, "{}: the NCCL communicator was aborted by an earlier failure", what);
      cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) {
        cudaGetLastError();
        abort_locked();
        fail("{}: CUDA error while waiting: {}", what, cuda::error_string(int(e)));
      }
      ncclResult_t st = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(comm_, &st);
      if (q != ncclSuccess) st = q;
      if (st != ncclSuccess && st != ncclInProgress) fail_nccl(st, what);
      if (Clock::now() > deadline) fail_timeout(what, deadline);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclCommunicator::flush_p2p_locked(Clock::time_point deadline) {
  if (pending_.empty()) return;
  ATOLL_CHECK(!aborted_, "send/recv: the NCCL communicator was aborted by an earlier failure");
  int prev = 0;
  cudaGetDevice(&prev);  // may run on a user thread in wait(): leave its device as it was
  use_device();
  auto s = static_cast<cudaStream_t>(stream_);
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) fail_nccl(r, "ncclGroupStart");
  for (auto& p : pending_) {
    const Tensor& b = p->buf.dev;
    r = p->is_send ? ncclSend(b.raw(), size_t(b.numel()), nccl_type(b.dtype()), p->peer, comm_, s)
                   : ncclRecv(b.raw(), size_t(b.numel()), nccl_type(b.dtype()), p->peer, comm_, s);
    if (r != ncclSuccess && r != ncclInProgress) {
      ncclGroupEnd();
      fail_nccl(r, p->is_send ? "ncclSend" : "ncclRecv");
    }
  }
  wait_enqueued(ncclGroupEnd(), "ncclGroupEnd (send/recv)", deadline);
  for (auto& p : pending_) {
    cuda_ok(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming), "cudaEventCreate");
    cuda_ok(cudaEventRecord(p->done, s), "cudaEventRecord");
    p->posted = true;
  }
  pending_.clear();
  cudaSetDevice(prev);
}

void NcclCommunicator::run_nccl(const char* call, const std::function<ncclResult_t()>& issue) {
  use_device();
  cudaEvent_t ev = nullptr;
  {
    std::lock_guard<std::mutex> lk(nccl_mu_);
    ATOLL_CHECK(!aborted_, "{}: the NCCL communicator was aborted by an earlier failure", call);
    flush_p2p_locked(deadline());  // sends/recvs issued before this op go first, as issued
    wait_enqueued(issue(), call, deadline());
    cuda_ok(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    cuda_ok(cudaEventRecord(ev, static_cast<cudaStream_t>(stream_)), "cudaEventRecord");
  }
  try {
    wait_stream_event(ev, call, deadline());
  } catch (...) {
    cudaEventDestroy(ev);
    throw;
  }
  cudaEventDestroy(ev);
}

void NcclCommunicator::run_all_reduce(const Tensor& t, ReduceOp op) {
  use_device();
  Staged s = stage(t, true);
  auto st = static_cast<cudaStream_t>(stream_);
  run_nccl("ncclAllReduce", [&] {
    return ncclAllReduce(s.dev.raw(), s.dev.raw(), size_t(t.numel()), nccl_type(t.dtype()),
                         nccl_op(op), comm_, st);
  });
  if (s.host.defined()) cuda::copy(s.host, s.dev);
}

void NcclCommunicator::run_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) {
  use_device();
  Staged si = stage(in, true), so = stage(out, false);
  auto st = static_cast<cudaStream_t>(stream_);
  run_nccl("ncclReduceScatter", [&] {
    return ncclReduceScatter(si.dev.raw(), so.dev.raw(), size_t(out.numel()),
                             nccl_type(in.dtype()), nccl_op(op), comm_, st);
  });
  if (so.host.defined()) cuda::copy(so.host, so.dev);
}

void NcclCommunicator::run_all_gather(const Tensor& in, const Tensor& out) {
  use_device();
  Staged si = stage(in, true), so = stage(out, false);
  auto st = static_cast<cudaStream_t>(stream_);
  run_nccl("ncclAllGather", [&] {
    return ncclAllGather(si.dev.raw(), so.dev.raw(), size_t(in.numel()), nccl_type(in.dtype()),
                         comm_, st);
  });
  if (so.host.defined()) cuda::copy(so.host, so.dev);
}

void NcclCommunicator::run_broadcast(const Tensor& t, int root) {
  use_device();
  Staged s = stage(t, rank() == root);
  auto st = static_cast<cudaStream_t>(stream_);
  run_nccl("ncclBroadcast", [&] {
    return ncclBroadcast(s.dev.raw(), s.dev.raw(), size_t(t.numel()), nccl_type(t.dtype()), root,
                         comm_, st);
  });
  if (s.host.defined() && rank() != root) cuda::copy(s.host, s.dev);
}

// All-to-all as one group of size() sends and size() receives (NCCL has no all-to-all call); the
// chunk a rank keeps is a plain device copy.
void NcclCommunicator::run_all_to_all(const Tensor& in, const Tensor& out) {
  use_device();
  Staged si = stage(in, true), so = stage(out, false);
  auto st = static_cast<cudaStream_t>(stream_);
  const size_t chunk = size_t(in.numel() / size());
  const size_t bytes = chunk * dtype_size(in.dtype());
  const ncclDataType_t ty = nccl_type(in.dtype());
  auto* src = static_cast<char*>(si.dev.raw());
  auto* dst = static_cast<char*>(so.dev.raw());
  run_nccl("all_to_all (ncclSend/ncclRecv group)", [&] {
    cudaError_t e = cudaMemcpyAsync(dst + size_t(rank()) * bytes, src + size_t(rank()) * bytes,
                                    bytes, cudaMemcpyDeviceToDevice, st);
    if (e != cudaSuccess) return ncclUnhandledCudaError;
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      r = ncclSend(src + size_t(p) * bytes, chunk, ty, p, comm_, st);
      if (r == ncclSuccess || r == ncclInProgress)
        r = ncclRecv(dst + size_t(p) * bytes, chunk, ty, p, comm_, st);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();
        return r;
      }
    }
    return ncclGroupEnd();
  });
  if (so.host.defined()) cuda::copy(so.host, so.dev);
}

void NcclCommunicator::run_barrier() {
  use_device();
  auto st = static_cast<cudaStream_t>(stream_);
  run_nccl("barrier (ncclAllReduce of one element)", [&] {
    return ncclAllReduce(barrier_buf_.raw(), barrier_buf_.raw(), 1, ncclFloat32, ncclSum, comm_, st);
  });
}

// Sends and receives are not given to NCCL when posted: they wait in pending_ until the next
// collective or the first wait() on any of them, and then go as one group. So isend + irecv
// between two ranks, waited in either order, progress together instead of deadlocking (NCCL
// point-to-point calls outside a group block until the peer's matching call runs).
std::function<void()> NcclCommunicator::post_send(const Tensor& t, int peer, int tag) {
  use_device();
  auto p = std::make_shared<P2p>();
  p->is_send = true;
  p->buf = stage(t, true);
  p->peer = peer;
  {
    std::lock_guard<std::mutex> lk(nccl_mu_);
    pending_.push_back(p);
  }
  auto dl = deadline();
  return [this, p, dl] {
    {
      std::lock_guard<std::mutex> lk(nccl_mu_);
      if (!p->posted) flush_p2p_locked(dl);
    }
    wait_stream_event(p->done, "ncclSend", dl);
    cudaEventDestroy(p->done);
    p->done = nullptr;
  };
}

std::function<void()> NcclCommunicator::post_recv(const Tensor& t, int peer, int tag) {
  use_device();
  auto p = std::make_shared<P2p>();
  p->is_send = false;
  p->buf = stage(t, false);
  p->peer = peer;
  {
    std::lock_guard<std::mutex> lk(nccl_mu_);
    pending_.push_back(p);
  }
  auto dl = deadline();
  return [this, p, dl] {
    {
      std::lock_guard<std::mutex> lk(nccl_mu_);
      if (!p->posted) flush_p2p_locked(dl);
    }
    wait_stream_event(p->done, "ncclRecv", dl);
    cudaEventDestroy(p->done);
    p->done = nullptr;
    if (p->buf.host.defined()) {
      int prev = 0;
      cudaGetDevice(&prev);  // a user thread: copy on this rank's device, then leave it as it was
      use_device();
      cuda::copy(p->buf.host, p->buf.dev);
      cudaSetDevice(prev);
    }
  };
}

std::unique_ptr<Communicator> NcclCommunicator::run_split(const std::vector<int>& members,
                                                          int new_rank, int color) {
  use_device();
  ncclConfig_t cfg = nonblocking_config();
  ncclComm_t child = nullptr;
  ncclResult_t r;
  {
    std::lock_guard<std::mutex> lk(nccl_mu_);
    ATOLL_CHECK(!aborted_, "split: the NCCL communicator was aborted by an earlier failure");
    flush_p2p_locked(deadline());
    // key = the rank in the new group, which the base class ordered by (key, rank) already.
    r = ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, new_rank < 0 ? 0 : new_rank,
                      &child, &cfg);
    wait_enqueued(r, "ncclCommSplit", deadline());
  }
  if (color < 0) return nullptr;
  ATOLL_CHECK(child != nullptr, "ncclCommSplit returned no communicator for color {}", color);
  wait_ready(child, r == ncclInProgress ? ncclInProgress : ncclSuccess, "ncclCommSplit (new group)",
             deadline(), timeout());
  std::vector<int> wr;
  for (int m : members) wr.push_back(world_ranks()[m]);
  return std::make_unique<NcclCommunicator>(proc_, child, device_, new_rank, int(members.size()),
                                            std::move(wr), timeout());
}

}  // namespace atl::comm
#endif  // ATOLL_HAVE_NCCL
