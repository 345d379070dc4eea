// Gloo backend (github.com/facebookincubator/gloo, Debian libgloo-dev): full-mesh TCP pairs set up
// through our TCP store; all_reduce, all_gather, broadcast, all_to_all and barrier are Gloo's own
// algorithms, reduce_scatter is a ring over Gloo's point-to-point buffers
// (reduce_scatter_ring.cpp) because this Gloo has no timeout-aware reduce-scatter.
#pragma once
#ifdef ATOLL_HAVE_GLOO
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/tcp_store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace atl::comm {

// What every Gloo communicator of one process shares: the store (and its server when this
// process hosts it), the lifeline connection that tells the store we are alive, the TCP device.
struct GlooProcess;

class GlooCommunicator : public Communicator {
 public:
  // The world communicator from DistEnv (rank 0 hosts the store unless `atoll launch` does).
  static std::unique_ptr<Communicator> create(const DistEnv& env, Millis timeout);
  // A communicator of `size` processes that meet under `prefix` in the store at addr:port, outside
  // any world communicator (fault tolerance: one per quorum, resilience/quorum.h). It neither hosts
  // the store nor registers a lifeline; errors name members by world_ranks. The mesh must connect
  // within connect_within.
  static std::unique_ptr<Communicator> create_group(const std::string& store_addr, int store_port, int rank,
                                                    std::vector<int> world_ranks, const std::string& prefix,
                                                    Millis timeout, Millis connect_within);
  ~GlooCommunicator() override;
  std::string backend() const override { return "gloo"; }

  GlooCommunicator(std::shared_ptr<GlooProcess> proc, int rank, int size,
                   std::vector<int> world_ranks, const std::string& prefix, Millis timeout,
                   Millis connect_within = Millis(-1));

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
  std::string diagnose() override;
  void on_op_start(const std::string& name, uint64_t seq) override;
  void run_abort() override;

 private:
  uint32_t tag() const { return uint32_t(op_seq()); }
  int world_ranks_of(int r) const;
  std::string diagnose_into(std::vector<int>& blamed);  // blamed: the world ranks it names
  void post_failure_report(const std::vector<int>& blamed, const std::string& why);
  std::shared_ptr<GlooProcess> proc_;
  std::shared_ptr<gloo::Context> ctx_;
  std::string prefix_;
  int splits_ = 0;
  std::string current_op_;
};

// Ring reduce-scatter (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce algorithms for
// clusters of workstations", first half) over Gloo unbound buffers. `in` has size chunks of
// `chunk` elements; out receives this rank's reduced chunk. dtype f32, i32 or i64; op sum or max.
// `out` may be chunk `rank` of `in` (in place, as NCCL allows): then no output buffer is needed.
// (Likewise all_gather's `in` may be chunk `rank` of its `out`.)
// Beyond its arguments it needs nothing on 2 ranks (two 256 KiB pieces in place), one chunk on 3,
// two on more (reduce_scatter_ring.cpp).
void ring_reduce_scatter(const std::shared_ptr<gloo::Context>& ctx, const Tensor& in,
                         const Tensor& out, ReduceOp op, uint32_t tag, Millis timeout);

}  // namespace atl::comm
#endif
