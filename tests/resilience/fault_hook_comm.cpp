#include "fault_hook_comm.h"

#include <thread>

#include "core/log.h"

namespace atl::resilience::test {

FaultHookCommunicator::FaultHookCommunicator(std::unique_ptr<comm::Communicator> inner)
    : Communicator(inner->rank(), inner->size(), inner->world_ranks(), inner->timeout()), inner_(std::move(inner)) {
  start_worker();
}

FaultHookCommunicator::~FaultHookCommunicator() { stop_worker(); }

void FaultHookCommunicator::run_all_reduce(const Tensor& t, comm::ReduceOp op) {
  ++issued;
  inner_->all_reduce(t, op);
}
void FaultHookCommunicator::run_reduce_scatter(const Tensor& in, const Tensor& out, comm::ReduceOp op) {
  ++issued;
  inner_->reduce_scatter(in, out, op);
}
void FaultHookCommunicator::run_all_gather(const Tensor& in, const Tensor& out) {
  ++issued;
  inner_->all_gather(in, out);
}
void FaultHookCommunicator::run_broadcast(const Tensor& t, int root) {
  ++issued;
  inner_->broadcast(t, root);
}
void FaultHookCommunicator::run_all_to_all(const Tensor& in, const Tensor& out) {
  ++issued;
  inner_->all_to_all(in, out);
}
void FaultHookCommunicator::run_barrier() {
  ++issued;
  inner_->barrier();
}

std::function<void()> FaultHookCommunicator::post_send(const Tensor& t, int peer, int tag) {
  ++issued;
  if (partitioned) return [] {};  // the message leaves for a link that is down
  if (drop_sends > 0) {
    --drop_sends;
    return [] {};  // never posted: the peer's receive waits for it until it times out
  }
  if (corrupt_sends > 0) {
    --corrupt_sends;
    Tensor c = t.clone();  // the sender's own buffer stays intact; the bytes on the wire do not
    static_cast<unsigned char*>(c.raw())[c.nbytes() / 2] ^= 0x10;
    auto w = inner_->send_async(c, peer, tag);
    return [w, c] { w->wait(); };
  }
  auto w = inner_->send_async(t, peer, tag);
  return [w] { w->wait(); };
}

std::function<void()> FaultHookCommunicator::post_recv(const Tensor& t, int peer, int tag) {
  ++issued;
  if (partitioned) {
    // Nothing gets through: the receive fails when the communicator's timeout says it would.
    auto until = std::chrono::steady_clock::now() + timeout();
    return [until, peer] {
      std::this_thread::sleep_until(until);
      fail("recv from rank {} timed out: nothing arrived", peer);
    };
  }
  auto w = inner_->recv_async(t, peer, tag);
  return [w] { w->wait(); };
}

std::unique_ptr<comm::Communicator> FaultHookCommunicator::run_split(const std::vector<int>&, int, int) {
  fail("the fault-hook communicator does not split");
}

void FaultHookCommunicator::run_abort() { inner_->abort("the fault-hook communicator was aborted"); }

}  // namespace atl::resilience::test
