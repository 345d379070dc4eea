// The communicator of a one-rank job: every collective is the identity (or a copy), so code
// written for N ranks runs unchanged on one.
#include <cstring>

#include "comm/communicator.h"

namespace atl::comm {

namespace {
class SingleCommunicator : public Communicator {
 public:
  explicit SingleCommunicator(Millis timeout, std::vector<int> world = {0})
      : Communicator(0, 1, std::move(world), timeout) {
    start_worker();
  }
  ~SingleCommunicator() override { stop_worker(); }
  std::string backend() const override { return "single"; }

 protected:
  void run_all_reduce(const Tensor&, ReduceOp) override {}
  void run_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp) override {
    std::memcpy(out.raw(), in.raw(), out.nbytes());
  }
  void run_all_gather(const Tensor& in, const Tensor& out) override {
    std::memcpy(out.raw(), in.raw(), in.nbytes());
  }
  void run_broadcast(const Tensor&, int) override {}
  void run_all_to_all(const Tensor& in, const Tensor& out) override {
    std::memcpy(out.raw(), in.raw(), in.nbytes());
  }
  void run_barrier() override {}
  // Unreachable: the base class rejects a peer equal to our own rank.
  std::function<void()> post_send(const Tensor&, int peer, int) override {
    fail("send to rank {} in a one-rank job", peer);
  }
  std::function<void()> post_recv(const Tensor&, int peer, int) override {
    fail("recv from rank {} in a one-rank job", peer);
  }
  std::unique_ptr<Communicator> run_split(const std::vector<int>& members, int, int) override {
    if (members.empty()) return nullptr;
    return std::make_unique<SingleCommunicator>(timeout(), world_ranks());
  }
};
}  // namespace

std::unique_ptr<Communicator> make_single_communicator(Millis timeout) {
  return std::make_unique<SingleCommunicator>(timeout);
}

}  // namespace atl::comm
