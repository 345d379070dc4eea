// Fault-tolerant data parallelism, the replica's side (torchft's Manager, Rice et al. 2025): each
// rank is a replica of the model; every step runs on the quorum the lighthouse forms for it
// (lighthouse.h), over a Gloo communicator made for that quorum and keyed by its id in the
// lighthouse's store.
//
//   state.step is the data position: the step's data is a function of (step, rank in quorum, size),
//   so a discarded step is redone on the new quorum with the same global batch.
//
//   step(state, compute, apply):
//     1. quorum for state.step (blocks until every alive replica asks); a changed membership, or a
//        member whose communicator failed, gets a fresh communicator;
//     2. a member whose committed step is behind the others' heals: weights, optimizer state and
//        the extra blob (RNG, data position...) are broadcast from the first member that is ahead;
//     3. compute(comm): forward, backward and the gradient all-reduce, on this quorum;
//     4. the commit vote (an all-reduce): the step counts only when every member finished it; then
//        apply() (the optimizer) runs and state.step advances. Otherwise nothing is applied and
//        step() returns false: the caller calls it again.
//   A heartbeat thread (its own connection) tells the lighthouse we live and learns who else does;
//   when a member of the current quorum is gone it aborts the communicator, so the blocked
//   collective fails at once instead of waiting out its timeout.
#pragma once
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace atl::resilience {

struct QuorumOptions {
  std::string lighthouse_host = "127.0.0.1";
  int lighthouse_port = 0;
  int replica_id = 0;
  std::chrono::milliseconds heartbeat{100};
  std::chrono::milliseconds comm_timeout{30000};    // a collective that neither finishes nor is aborted
  std::chrono::milliseconds connect_within{10000};  // a quorum's communicator must connect within
  int slots = 0;  // DeadPool: the job's size (a smaller quorum is reported: no spare was left)
  // [fault] lighthouse = "HOST:PORT", heartbeat_ms; replica id from RANK. From ATOLL_LIGHTHOUSE
  // when set (`atoll launch --ft` sets it).
  static QuorumOptions from_environment();
};

// What a replica is, as far as healing goes: tensors broadcast in place (so a joiner must have
// them allocated with the same shapes), plus a small blob for everything else.
struct ReplicaState {
  int64_t step = 0;  // committed steps = the next step to run
  std::vector<Tensor> tensors;
  std::function<std::string()> save_extra;
  std::function<void(const std::string&)> load_extra;
  // State that is this replica's own and so is not broadcast (DeadPool: a rank's RNG stream, its
  // data position): rolled forward from step `from` to `to` when a heal moves the replica ahead.
  std::function<void(int64_t from, int64_t to)> advance_own;
  // Called before a heal writes into the tensors (DeadPool: a snapshot copy may still read them).
  std::function<void()> before_write;
};

struct QuorumStats {
  int64_t committed = 0, discarded = 0, heals = 0, reconfigurations = 0;
  double last_heal_ms = 0, last_reconfigure_ms = 0;
  double last_recovery_ms = 0;  // from the discarded step to the next commit
};

class QuorumReplica {
 public:
  explicit QuorumReplica(const QuorumOptions& o);
  ~QuorumReplica();

  bool step(ReplicaState& state, const std::function<void(comm::Communicator&)>& compute,
            const std::function<void()>& apply);

  // The current quorum (valid inside compute and after step()).
  comm::Communicator* comm() const { return comm_.get(); }
  int64_t quorum_id() const { return quorum_id_; }
  const std::vector<int>& members() const { return members_; }
  const QuorumStats& stats() const { return stats_; }
  // At the end of training: waits at the lighthouse until every alive replica has finished too, so
  // that no replica leaves (and so aborts the others' last commit) while one is still finishing.
  void finish(const ReplicaState& state);
  // What the heartbeat reports (the observer shows it): the trainer's phase.
  void set_phase(const std::string& phase);

 private:
  struct Heartbeat;
  void join_quorum(ReplicaState& state);
  void heal(ReplicaState& state, int source, int64_t target_step);
  void retire_comm();

  QuorumOptions o_;
  std::string nonce_;
  std::string store_host_;
  int store_port_ = 0;
  std::unique_ptr<Heartbeat> hb_;
  std::unique_ptr<comm::Communicator> comm_;
  std::vector<std::unique_ptr<comm::Communicator>> retired_;
  int64_t quorum_id_ = -1;
  std::vector<int> members_;
  bool comm_failed_ = false;
  // Since when a failure is being recovered from (a discarded step), for the recovery log line.
  std::chrono::steady_clock::time_point failed_at_{};
  bool recovering_ = false;
  int consecutive_discards_ = 0;
  QuorumStats stats_;
};

}  // namespace atl::resilience
