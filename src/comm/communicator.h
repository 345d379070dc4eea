// Communicator: the one interface every distributed feature talks to (DDP, ZeRO, tensor/pipeline
// parallelism, low-communication training). Backends (Gloo over TCP, MPI, a single-process one)
// implement a handful of protected run_* methods; this base class owns what they share:
//
//  - argument checks (contiguous CPU tensors of f32, bf16, i32, i64, matching sizes);
//  - bf16 reductions, done in f32 (widened, reduced, rounded once) so that no backend ever
//    accumulates in bf16;
//  - asynchrony: every operation is queued to one background thread per communicator and runs
//    there in the order it was issued, like a CUDA stream, so DDP can start a bucket's all_reduce
//    during backward and wait() on it later. The blocking calls are "start, then wait()";
//  - timeouts: every operation carries a deadline (timeout(), 300 s unless configured); a rank that
//    dies or stops answering makes the operation throw atl::Error naming the collective, its
//    sequence number and the rank that failed, as far as the backend can tell. A communicator that
//    has failed once stays failed: later operations throw the first error again.
//
// Tensors passed to an asynchronous operation must stay alive and untouched until wait() returns
// (the Work handle keeps a reference to their storage, so "alive" is automatic).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tensor/tensor.h"

namespace atl::comm {

enum class ReduceOp { sum, avg, max };
const char* reduce_op_name(ReduceOp op);

using Millis = std::chrono::milliseconds;

// ATOLL_COMM_TIMEOUT (seconds, fractional allowed) or 300 s.
Millis default_timeout();

// A queued operation. wait() blocks until it has run and rethrows its error, if any; it may be
// called more than once, from any thread. The communicator must outlive its Work handles.
class Work {
 public:
  void wait();
  // Ran to completion (for send/recv: completed by a wait()), successfully or not.
  bool done() const;
  const std::string& what() const { return name_; }  // "all_reduce #12"

 private:
  friend class Communicator;
  std::string name_;
  uint64_t seq_ = 0;
  std::function<void(Work&)> run_;  // on the worker thread
  std::function<void()> finish_;  // set by point-to-point posts; runs in wait()
  std::vector<Tensor> keep_;      // storage kept alive while queued
  Millis timeout_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false, started_ = false, finished_ = false;
  std::chrono::steady_clock::time_point start_time_;
  std::string error_;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The rank of each member in the world communicator this one was split from (errors name these).
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  virtual std::string backend() const = 0;
  Millis timeout() const { return timeout_; }
  void set_timeout(Millis t) { timeout_ = t; }

  // ---- asynchronous: queued now, run in issue order on this communicator's thread ----
  // In place over every rank's `t`. avg is for f32/bf16 only.
  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op = ReduceOp::sum);
  // `in` holds size() equal chunks; rank r receives the reduction of chunk r in `out`.
  WorkPtr reduce_scatter_async(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum);
  // `out` receives every rank's `in`, rank 0's first; out.numel() == size() * in.numel().
  WorkPtr all_gather_async(const Tensor& in, const Tensor& out);
  WorkPtr broadcast_async(const Tensor& t, int root);
  // Chunk j of `in` goes to rank j; chunk i of `out` comes from rank i.
  WorkPtr all_to_all_async(const Tensor& in, const Tensor& out);
  // Point to point. The post happens in issue order on the worker; completion is awaited in
  // wait(), so isend + irecv pairs between two ranks cannot deadlock.
  WorkPtr send_async(const Tensor& t, int peer, int tag = 0);
  WorkPtr recv_async(const Tensor& t, int peer, int tag = 0);
  WorkPtr barrier_async();
  // A local step (no traffic) run on the worker in issue order, between the operations issued
  // before and after it: e.g. a codec's decode-and-sum between its all_to_all and its all_gather
  // (comm/compressed_allreduce.h), so a whole compressed exchange can be queued at once and
  // overlap the caller's compute. fn must touch only what the caller leaves alone until wait();
  // if it throws, the communicator fails like a failed collective.
  WorkPtr run_async(const std::string& what, std::function<void()> fn);

  // ---- blocking: the same operations, waited for ----
  void all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum) { all_reduce_async(t, op)->wait(); }
  void reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op = ReduceOp::sum) {
    reduce_scatter_async(in, out, op)->wait();
  }
  void all_gather(const Tensor& in, const Tensor& out) { all_gather_async(in, out)->wait(); }
  void broadcast(const Tensor& t, int root) { broadcast_async(t, root)->wait(); }
  void all_to_all(const Tensor& in, const Tensor& out) { all_to_all_async(in, out)->wait(); }
  void send(const Tensor& t, int peer, int tag = 0) { send_async(t, peer, tag)->wait(); }
  void recv(const Tensor& t, int peer, int tag = 0) { recv_async(t, peer, tag)->wait(); }
  void barrier() { barrier_async()->wait(); }

  // Collective over this communicator: ranks with the same color form a sub-communicator, ordered
  // by (key, rank). A negative color takes part but gets nullptr back.
  std::unique_ptr<Communicator> split(int color, int key);

  // Fails the running and every queued operation now, with `why`, instead of letting them wait out
  // the timeout (fault tolerance: the lighthouse said a member is gone, resilience/quorum.h). The
  // communicator stays failed; the backend unblocks its running call where it can (Gloo closes its
  // pairs). Safe from any thread. Destroying an aborted communicator may still wait for that call
  // to return (at most its timeout), so fault-tolerant callers retire, not destroy, them.
  void abort(const std::string& why);
  bool aborted() const;

 protected:
  Communicator(int rank, int size, std::vector<int> world_ranks, Millis timeout);
  // Backends call this at the end of their constructor, and stop_worker() first thing in their
  // destructor (the worker must not run a backend method on a half-destroyed object).
  void start_worker();
  void stop_worker();

  // Run on the worker thread, synchronously, within `deadline()`; throw on failure. Reductions
  // only ever see f32, i32 and i64 (bf16 is widened by the base class) and never avg.
  virtual void run_all_reduce(const Tensor& t, ReduceOp op) = 0;
  virtual void run_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) = 0;
  virtual void run_all_gather(const Tensor& in, const Tensor& out) = 0;
  virtual void run_broadcast(const Tensor& t, int root) = 0;
  virtual void run_all_to_all(const Tensor& in, const Tensor& out) = 0;
  virtual void run_barrier() = 0;
  // Post a transfer and return what completes it (called from wait(), on the user's thread).
  virtual std::function<void()> post_send(const Tensor& t, int peer, int tag) = 0;
  virtual std::function<void()> post_recv(const Tensor& t, int peer, int tag) = 0;
  // The new group's members as ranks of this communicator, ordered by (key, rank); this rank is
  // members[new_rank]. Every member calls it with the same members and color.
  virtual std::unique_ptr<Communicator> run_split(const std::vector<int>& members, int new_rank,
                                                  int color) = 0;
  // Called after a backend call threw: a sentence saying which rank is to blame, if known.
  virtual std::string diagnose() { return ""; }
  // Current op (name and sequence number), for heartbeats and diagnoses.
  virtual void on_op_start(const std::string& name, uint64_t seq) {}
  // abort(): make the backend call running on the worker return soon (from another thread).
  virtual void run_abort() {}

  std::chrono::steady_clock::time_point deadline() const { return op_deadline_; }
  Millis remaining() const;
  // Sequence number of the operation running on the worker (the same on every rank: ranks issue
  // operations in the same order), used as the backend's message tag.
  uint64_t op_seq() const { return running_seq_; }

 private:
  WorkPtr enqueue(std::string op, std::vector<Tensor> keep, std::function<void(Work&)> run);
  WorkPtr post_p2p(const char* op, const Tensor& t, int peer, int tag);
  std::string describe_failure(const std::string& op, const std::exception& e);
  void worker_loop();

  int rank_, size_;
  std::vector<int> world_ranks_;
  Millis timeout_;
  uint64_t seq_ = 0;  // operations issued (user thread)
  uint64_t running_seq_ = 0;  // the operation the worker runs
  std::chrono::steady_clock::time_point op_deadline_;

  std::mutex qmu_;
  std::condition_variable qcv_;
  std::deque<WorkPtr> queue_;
  bool stopping_ = false;
  std::string failed_;  // first failure; every later op rethrows it
  std::string aborted_;  // abort()'s reason (under qmu_)
  WorkPtr running_;      // the operation on the worker (under qmu_), for abort()
  std::thread worker_;
};

// torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT; under mpirun/srun the rank comes from OMPI_COMM_WORLD_RANK, PMI_RANK or
// SLURM_PROCID instead.
struct DistEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // `atoll launch` hosts the store itself and says where (ATOLL_STORE_ADDR, ATOLL_STORE_PORT),
  // leaving MASTER_PORT free for rank 0 as torchrun does (so torch.distributed runs under it too).
  // Otherwise rank 0 hosts the store at MASTER_ADDR:MASTER_PORT.
  bool store_hosted_externally = false;
  std::string store_addr;
  int store_port = 0;
  bool launched_by_mpi = false;
  static DistEnv from_environment();
};

// backend: "auto" (MPI when started by mpirun/srun and built with MPI, Gloo when WORLD_SIZE > 1,
// otherwise the single-process communicator), "gloo", "mpi" or "single".
std::unique_ptr<Communicator> make_communicator(const std::string& backend = "auto",
                                                Millis timeout = default_timeout());
std::unique_ptr<Communicator> make_single_communicator(Millis timeout = default_timeout());

}  // namespace atl::comm
