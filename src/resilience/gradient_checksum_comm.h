// A communicator that checks every gradient all-reduce it carries against its senders' checksums
// (issue 14, the campaign's payload_corruption inside `atoll train`: train/fault_campaign_hook.h).
// An algorithm-based check (after Huang & Abraham's checksums, IEEE Trans. Computers 1984): a sum
// is linear, so the sum of the reduced bucket must equal the sum of every rank's contribution,
// up to the rounding of the float32 reduction, which is bounded whatever the summation order.
//
// Per gradient bucket (an f32 sum whose data lies in the model's gradient buffer):
//  1. before sending: the contribution's sum S, absolute sum A (in double) and CRC-32C; a copy of
//     the contribution is kept;
//  2. the all-reduce (the payload is what leaves: a fault armed on this rank corrupts it here,
//     after its checksum);
//  3. the ranks all-gather (S, A, CRC) and each checks sum(result) against sum_q S_q: the float32
//     reduction of n terms errs by at most gamma(n-1) * sum_i sum_q |g_q[i]| <= gamma(n-1) * sum_q
//     A_q (gamma(k) = k u / (1 - k u), u = 2^-24; Higham, Accuracy and Stability, 2002, sec. 4.2),
//     and the double sums add at most N 2^-52 of their absolute sums: a difference above that bound
//     is corruption, and none below it is called one (no false positive on any CPU);
//  4. on a mismatch, localization: every rank's kept contribution is re-sent (an all-gather) and
//     every receiver checks each sender's payload against its CRC; the senders that fail are named
//     (evidence about their outgoing payload, no vote needed). A corruption that does not recur is
//     transient and reported as inconclusive;
//  5. repair: the kept contributions all-reduced again (the fault's window is over) and checked
//     again; the result is then the clean run's, bit for bit. A second mismatch fails the step.
// Reach: a corruption changing the bucket's sum by less than the bound is not seen (such a change
// is of the reduction's own rounding size). Cost: the copy, two passes over the bucket and a
// 24-byte all-gather per bucket per step: a test mode, like the campaign.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "nn/model.h"

namespace atl::resilience {

struct PayloadFinding {
  std::string bucket;      // "bucket [lo, hi)"
  std::vector<int> ranks;  // the senders whose re-sent payload failed its CRC (empty: transient)
  std::vector<int> missing;  // of those, the ones whose re-sent payload never arrived (all zero)
  double diff = 0, bound = 0;
};

class GradientChecksumComm final : public comm::Communicator {
 public:
  // inner: the data-parallel communicator (not owned, outlives this one); model: whose gradient
  // buffer holds the buckets checked.
  GradientChecksumComm(comm::Communicator* inner, const nn::Model& model);
  ~GradientChecksumComm() override;
  std::string backend() const override { return inner_->backend(); }

  // The fault (payload_corruption): this rank's next gradient bucket leaves with the sign of its
  // largest element flipped, after its checksum, and so does its re-sent copy in the localization
  // (the step's outgoing gradient messages); the repair's all-reduce is clean.
  void arm_corruption();
  // The fault (message_drop): this rank's next gradient bucket never lands: the receivers' buffers
  // keep what they held (the sum lacks its contribution), and so does its re-sent copy in the
  // localization (its slot stays empty: named as missing, not as corrupt); the repair is clean.
  void arm_drop();
  // Mismatches found since the last call.
  std::vector<PayloadFinding> take_findings();
  int64_t buckets_checked() const { return checked_; }
  // CPU time of the checks (the sums, CRCs, copies and the extra all-gather; not the all-reduce itself).
  int64_t check_cpu_ns() const { return cpu_ns_.load(); }

 private:
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
  bool is_gradient(const Tensor& t) const;
  void checked_all_reduce(const Tensor& t);

  comm::Communicator* inner_;
  const nn::Model& model_;
  std::mutex mu_;
  bool armed_ = false, drop_ = false;  // guarded by mu_
  std::vector<PayloadFinding> findings_;
  std::atomic<int64_t> checked_{0}, cpu_ns_{0};
};

}  // namespace atl::resilience
