// A test-only fault hook at the communicator (the fault campaign, test_campaign.cpp): a
// Communicator that passes every operation to the one it wraps, except where a fault is armed on
// the point-to-point path, where it really alters the traffic: flips a bit of an outgoing
// message's bytes after the sender checksummed them (payload corruption), does not post an
// outgoing message at all (message drop), or, once partitioned, sends nothing and lets nothing in
// (a network partition at the communicator: the test bed has no network namespace to put a link
// down in). The peers see what they would on a real network: a checksum that does not match, or
// a receive that times out.
#pragma once
#include <atomic>
#include <memory>

#include "comm/communicator.h"

namespace atl::resilience::test {

class FaultHookCommunicator : public comm::Communicator {
 public:
  explicit FaultHookCommunicator(std::unique_ptr<comm::Communicator> inner);
  ~FaultHookCommunicator() override;
  std::string backend() const override { return "fault-hook(" + inner_->backend() + ")"; }

  std::atomic<int> corrupt_sends{0};  // the next N sends leave with one bit flipped
  std::atomic<int> drop_sends{0};     // the next N sends are never posted
  std::atomic<bool> partitioned{false};
  // Operations issued through this communicator (for the signatures' collective fingerprint).
  std::atomic<uint64_t> issued{0};

 protected:
  void run_all_reduce(const Tensor& t, comm::ReduceOp op) override;
  void run_reduce_scatter(const Tensor& in, const Tensor& out, comm::ReduceOp op) override;
  void run_all_gather(const Tensor& in, const Tensor& out) override;
  void run_broadcast(const Tensor& t, int root) override;
  void run_all_to_all(const Tensor& in, const Tensor& out) override;
  void run_barrier() override;
  std::function<void()> post_send(const Tensor& t, int peer, int tag) override;
  std::function<void()> post_recv(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<comm::Communicator> run_split(const std::vector<int>& members, int new_rank, int color) override;
  void run_abort() override;

 private:
  std::unique_ptr<comm::Communicator> inner_;
};

}  // namespace atl::resilience::test
