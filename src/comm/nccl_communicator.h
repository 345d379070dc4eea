// NCCL backend (NVIDIA Collective Communications Library, docs.nvidia.com/deeplearning/nccl):
// collectives between GPUs, one GPU per rank. Rank 0 makes the ncclUniqueId and shares it through
// atoll's TCP store; the communicator is non-blocking (ncclConfig_t.blocking = 0) so that every
// operation can be polled against its deadline and aborted (ncclCommAbort) when a peer is gone.
//
// Tensors: CUDA tensors on this rank's device are used in place; CPU tensors are staged through
// device buffers (the Communicator base class hands backends CPU tensors today, see
// docs/distributed.md). Built only with the CUDA toolkit and NCCL (ATOLL_HAVE_NCCL).
#pragma once
#ifdef ATOLL_HAVE_NCCL
#include <nccl.h>

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace atl::comm {

// The store (and its server, on rank 0) shared by a world communicator and its splits.
struct NcclProcess;

class NcclCommunicator : public Communicator {
 public:
  // The world communicator from DistEnv, on CUDA device LOCAL_RANK. Throws atl::Error saying why
  // when no CUDA device is visible or there are fewer devices than ranks on this node (NCCL does
  // not support two ranks of one communicator on the same GPU).
  static std::unique_ptr<Communicator> create(const DistEnv& env, Millis timeout);
  ~NcclCommunicator() override;
  std::string backend() const override { return "nccl"; }
  int device() const { return device_; }

  NcclCommunicator(std::shared_ptr<NcclProcess> proc, ncclComm_t comm, int device, int rank,
                   int size, std::vector<int> world_ranks, Millis timeout);

 protected:
  void run_all_reduce(const Tensor& t, ReduceOp op) override;
  void run_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) override;
  void run_all_gather(const Tensor& in, const Tensor& out) override;
  void run_broadcast(const Tensor& t, int root) override;
  void run_all_to_all(const Tensor& in, const Tensor& out) override;
  void run_barrier() override;
  std::function<void()> post_send(const Tensor& t, int peer, int tag) override;
  std::function<void()> post_recv(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<Communicator> run_split(const std::vector<int>& members, int new_rank,
                                          int color) override;

 private:
  struct Staged {
    Tensor dev;   // what NCCL reads and writes
    Tensor host;  // the caller's CPU tensor when dev is a staging copy of it
  };
  struct P2p;
  Staged stage(const Tensor& t, bool read);
  void use_device();  // the calling thread's current device := device_
  // Issues a NCCL call (under nccl_mu_, after any pending send/recv) and waits, polling, until it
  // and its stream work are done; throws naming the NCCL error or the timeout (and aborts).
  void run_nccl(const char* call, const std::function<ncclResult_t()>& issue);
  // Posts pending sends/recvs as one NCCL group (caller holds nccl_mu_).
  void flush_p2p_locked(std::chrono::steady_clock::time_point deadline);
  // Polls until NCCL has enqueued what `issued` started (non-blocking mode returns ncclInProgress).
  void wait_enqueued(ncclResult_t issued, const char* call,
                     std::chrono::steady_clock::time_point deadline);
  void wait_stream_event(void* event, const char* what, std::chrono::steady_clock::time_point deadline);
  [[noreturn]] void fail_nccl(ncclResult_t r, const char* call);
  [[noreturn]] void fail_timeout(const char* what, std::chrono::steady_clock::time_point deadline);
  void abort_locked();

  std::shared_ptr<NcclProcess> proc_;
  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  void* stream_ = nullptr;  // cudaStream_t: all of this communicator's NCCL work runs on it
  std::mutex nccl_mu_;      // serializes NCCL calls of the worker and of wait() on user threads
  bool aborted_ = false;    // under nccl_mu_
  std::vector<std::shared_ptr<P2p>> pending_;  // posted sends/recvs not yet given to NCCL
  Tensor barrier_buf_;  // one f32 on the device
};

}  // namespace atl::comm
#endif
