// MPI backend: MPI-3 non-blocking collectives (MPI_Iallreduce, MPI_Ireduce_scatter_block, ...)
// polled with MPI_Test until done or past the deadline. MPI itself has no timeouts, and a rank
// that dies is reported by mpirun, which then ends the job; polling is what keeps a rank that
// merely stops answering from hanging the others forever.
#include "comm/mpi_communicator.h"

#ifdef ATOLL_HAVE_MPI
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <thread>
#endif

namespace atl::comm {

#ifndef ATOLL_HAVE_MPI
bool mpi_available() { return false; }
std::unique_ptr<Communicator> make_mpi_communicator(Millis) {
  fail("atoll was built without MPI (install libopenmpi-dev and rebuild) ");
}
#else
bool mpi_available() { return true; }

namespace {

// Every MPI call goes through this lock: correct whatever thread level the library grants,
// and cheap because each call is short (waiting is done by polling, outside the lock).
std::mutex& mpi_mu() {
  static std::mutex m;
  return m;
}
bool g_failed = false;

void at_exit() {
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) return;
  // MPI_Finalize would wait for ranks that are gone or stuck; abort ends the job instead.
  if (g_failed)
    MPI_Abort(MPI_COMM_WORLD, 1);
  else
    MPI_Finalize();
}

void ensure_init() {
  std::lock_guard<std::mutex> lk(mpi_mu());
  int init = 0;
  MPI_Initialized(&init);
  if (init) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  ATOLL_CHECK(provided >= MPI_THREAD_SERIALIZED,
              "MPI granted thread level {}; atoll needs at least MPI_THREAD_SERIALIZED", provided);
  std::atexit(at_exit);
}

void check_rc(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("{} failed: {}", call, std::string(msg, size_t(len)));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    default: fail("MPI reduction on {}: bf16 must be widened first", dtype_name(t));
  }
}

int count_of(size_t n, const char* what) {
  ATOLL_CHECK(n <= size_t(INT_MAX), "MPI {}: {} elements exceed MPI's int count; split the buffer",
              what, n);
  return int(n);
}

// Polls a request until it completes or the deadline passes.
void wait_request(MPI_Request& req, std::chrono::steady_clock::time_point deadline, Millis timeout,
                  const char* what) {
  auto start = std::chrono::steady_clock::now();
  for (;;) {
    int flag = 0;
    {
      std::lock_guard<std::mutex> lk(mpi_mu());
      check_rc(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), what);
    }
    if (flag) return;
    auto now = std::chrono::steady_clock::now();
    if (now > deadline) {
      g_failed = true;
      fail("no answer within the timeout of {:.1f} s: some rank has not joined this operation or "
           "stopped answering (mpirun reports ranks that died)",
           timeout.count() / 1000.0);
    }
    // Spin briefly for latency, then back off so a long wait does not burn a core.
    if (now - start < Millis(2))
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::vector<int> world, Millis timeout)
      : Communicator(rank, size, std::move(world), timeout), comm_(comm) {
    start_worker();
  }
  ~MpiCommunicator() override {
    stop_worker();
    int fin = 0;
    std::lock_guard<std::mutex> lk(mpi_mu());
    MPI_Finalized(&fin);
    if (!fin && comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }
  std::string backend() const override { return "mpi"; }

 protected:
  template <typename F>
  void run(const char* what, F&& post) {
    MPI_Request req;
    {
      std::lock_guard<std::mutex> lk(mpi_mu());
      check_rc(post(&req), what);
    }
    wait_request(req, deadline(), timeout(), what);
  }
  void run_all_reduce(const Tensor& t, ReduceOp op) override {
    int n = count_of(size_t(t.numel()), "all_reduce");
    MPI_Op mop = op == ReduceOp::max ? MPI_MAX : MPI_SUM;
    run("MPI_Iallreduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, t.raw(), n, mpi_type(t.dtype()), mop, comm_, r);
    });
  }
  void run_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override {
    int n = count_of(size_t(out.numel()), "reduce_scatter");
    MPI_Op mop = op == ReduceOp::max ? MPI_MAX : MPI_SUM;
    run("MPI_Ireduce_scatter_block", [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in.raw(), out.raw(), n, mpi_type(in.dtype()), mop, comm_, r);
    });
  }
  void run_all_gather(const Tensor& in, const Tensor& out) override {
    int n = count_of(in.nbytes(), "all_gather");
    run("MPI_Iallgather", [&](MPI_Request* r) {
      return MPI_Iallgather(in.raw(), n, MPI_BYTE, out.raw(), n, MPI_BYTE, comm_, r);
    });
  }
  void run_broadcast(const Tensor& t, int root) override {
    int n = count_of(t.nbytes(), "broadcast");
    run("MPI_Ibcast", [&](MPI_Request* r) { return MPI_Ibcast(t.raw(), n, MPI_BYTE, root, comm_, r); });
  }
  void run_all_to_all(const Tensor& in, const Tensor& out) override {
    int n = count_of(in.nbytes() / size_t(size()), "all_to_all");
    run("MPI_Ialltoall", [&](MPI_Request* r) {
      return MPI_Ialltoall(in.raw(), n, MPI_BYTE, out.raw(), n, MPI_BYTE, comm_, r);
    });
  }
  void run_barrier() override {
    run("MPI_Ibarrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }
  std::function<void()> post(bool send, const Tensor& t, int peer, int tag) {
    int n = count_of(t.nbytes(), send ? "send" : "recv");
    auto req = std::make_shared<MPI_Request>();
    {
      std::lock_guard<std::mutex> lk(mpi_mu());
      if (send)
        check_rc(MPI_Isend(t.raw(), n, MPI_BYTE, peer, tag, comm_, req.get()), "MPI_Isend");
      else
        check_rc(MPI_Irecv(t.raw(), n, MPI_BYTE, peer, tag, comm_, req.get()), "MPI_Irecv");
    }
    Millis to = timeout();
    return [req, to, send] {
      wait_request(*req, std::chrono::steady_clock::now() + to, to, send ? "MPI_Isend" : "MPI_Irecv");
    };
  }
  std::function<void()> post_send(const Tensor& t, int peer, int tag) override {
    return post(true, t, peer, tag);
  }
  std::function<void()> post_recv(const Tensor& t, int peer, int tag) override {
    return post(false, t, peer, tag);
  }
  std::unique_ptr<Communicator> run_split(const std::vector<int>& members, int new_rank,
                                          int color) override {
    MPI_Comm nc = MPI_COMM_NULL;
    {
      std::lock_guard<std::mutex> lk(mpi_mu());
      check_rc(MPI_Comm_split(comm_, members.empty() ? MPI_UNDEFINED : color,
                              members.empty() ? 0 : new_rank, &nc),
               "MPI_Comm_split");
      if (nc != MPI_COMM_NULL) MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    }
    if (nc == MPI_COMM_NULL) return nullptr;
    std::vector<int> wr;
    for (int m : members) wr.push_back(world_ranks()[size_t(m)]);
    return std::make_unique<MpiCommunicator>(nc, new_rank, int(members.size()), wr, timeout());
  }
  std::string diagnose() override {
    g_failed = true;
    return "";
  }

 private:
  MPI_Comm comm_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(Millis timeout) {
  ensure_init();
  int rank = 0, size = 1;
  {
    std::lock_guard<std::mutex> lk(mpi_mu());
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, rank, size, std::vector<int>{}, timeout);
}
#endif

}  // namespace atl::comm
