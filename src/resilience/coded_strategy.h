// Gradient coding as a data-parallel strategy of `atoll train` ([parallel] strategy = "coded";
// issue 14 item 5; Tandon et al., "Gradient Coding", ICML 2017, fractional repetition).
//
// n ranks in n / (s + 1) groups of s + 1 consecutive ranks ([parallel] coded_stragglers = s, which
// must divide... (s + 1) | n). The ranks of a group hold the same data — the trainer gives rank w
// the data shard w / (s + 1) of n / (s + 1) (Trainer's data_env) — so they compute the same
// gradient, bit for bit: each rank's coded message is the gradient of its group's s + 1 partitions
// (its micro-batches), the fractional-repetition code. A rank posts its message to every other rank
// over point-to-point TCP (resilience/coded_exchange.h) and goes on as soon as the first n - s
// messages are in: any n - s contain a member of every group, and the full gradient is the mean
// of one message per group. Up to s stragglers (a slow node, a stopped one) cost the others
// nothing.
//
// The decoded gradient is the uncoded data-parallel gradient of the same data: a DDP job over
// n / (s + 1) ranks, one per group (with 2 groups the same sum, bitwise: a + b = b + a).
// What it costs: (s + 1)x the ranks for the same data (the redundancy that makes waiting
// unnecessary).
//
// In the trainer: the strategy has no communicator of its own (DataParallel::average and join are
// local), so nothing in a step waits for the other ranks; the logged loss is the rank's own
// group's. The phase guard is off under it (a per-step world collective would wait for the
// straggler); checkpoints still meet at a barrier. Straggler injection for tests and benchmarks:
// [parallel] coded_delay_rank = r, coded_delay_ms = d: rank r sleeps d ms after its backward in
// every step where it is not behind; a rank whose step's n - s messages are already in when it
// gets there is behind and does not sleep (the library's catch-up: the others left it, so its
// slowness is skipped).
#pragma once
#include <memory>

#include "parallel/data_parallel.h"
#include "resilience/coded_exchange.h"

namespace atl::resilience {

class CodedStrategy final : public parallel::DataParallel {
 public:
  CodedStrategy(nn::Model& model, comm::Communicator& world, int stragglers, std::unique_ptr<Optimizer> opt,
                const AdamWConfig& ac, int delay_rank, double delay_ms);
  ~CodedStrategy() override;
  std::string name() const override { return "coded"; }
  void zero_grad() override;
  void finish_backward() override;
  double grad_norm() override;
  void step(const StepContext& ctx) override;
  void full_state(std::vector<std::pair<std::string, Tensor>>& model_sd,
                  std::vector<std::pair<std::string, Tensor>>& opt_state) override;
  void load_full_state(const std::vector<std::pair<std::string, Tensor>>& model_sd, const TensorFile& opt_state,
                       const std::string& what) override;
  // The last step's: the ranks whose messages were decoded, and the ms waited for them.
  const std::vector<int>& decoded() const { return decoded_; }
  double wait_ms() const { return wait_ms_; }

 private:
  std::unique_ptr<CodedExchange> ex_;
  int n_, s_, me_, delay_rank_;
  double delay_ms_;
  int64_t t_ = 0;  // exchanges so far (every rank makes one per step)
  std::vector<int> decoded_;
  std::vector<int64_t> missing_;  // per rank: steps decoded without its message
  double wait_ms_ = 0;
};

}  // namespace atl::resilience
