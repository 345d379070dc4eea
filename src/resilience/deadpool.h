// DeadPool (issue 14 item 2): spares waiting in a pool at the lighthouse, and each slot's state
// kept in the memory of the next slot's process (peer_snapshot.h), so that a spare that takes a
// dead slot's place restores it from memory and the job goes on at full size without a restart.
//
//   slot s of n holds the snapshots of slot s-1 (mod n) and sends its own to slot s+1 (mod n);
//   each holder's address is in the lighthouse's store under "deadpool/holder/<slot>", so a spare
//   that becomes slot s publishes its own holder there and its neighbour's sender finds it.
//
// With one copy, one failure at a time: a snapshot lives in one peer, so losing a slot and its
// holder together (two neighbours) loses that snapshot (the spare then heals the replicated state
// from a live peer and only the slot's own state is gone; the spare says so). With two copies
// ([fault] snapshot_copies = 2, 3 slots or more) slot s also sends its snapshot to slot s+2, and a
// spare restores from whichever of s+1 and s+2 answers with the newer one: two neighbours lost
// together lose nothing (three in a row still do). The second copy costs a second staging copy
// and send, off the critical path like the first.
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "resilience/peer_snapshot.h"

namespace atl::comm {
class TcpStore;
}

namespace atl::resilience {

// Registers spare `spare_id` in the lighthouse's pool and blocks until it is given a slot: returns
// the slot, or -1 when every slot finished without needing it (or the lighthouse went away, or
// `within` passed).
int wait_for_slot(const std::string& lighthouse_host, int lighthouse_port, int spare_id,
                  std::chrono::milliseconds within);

class PeerCheckpointer {
 public:
  // `advertise_host`: the address peers reach this process's holder at.
  PeerCheckpointer(const std::string& lighthouse_host, int lighthouse_port, int slot, int slots, int every,
                   const std::string& advertise_host = "127.0.0.1", int copies = 1);
  ~PeerCheckpointer();
  // After a committed step: when step % every == 0, starts the snapshot of `parts` (views of the
  // live state, unchanged until fence()).
  void after_commit(int64_t step, std::vector<SnapshotSender::Part> parts);
  void after_commit(int64_t step, std::function<void(std::string&)> fill);
  // Before the state changes (the next optimizer step): the copy must be done. Returns ms waited.
  double fence() { return sender_->fence() + (second_ ? second_->fence() : 0.0); }
  // This slot's last snapshot, from its holder (what a spare that took the slot restores); with two
  // copies the newer of the two holders' (a holder that cannot be reached is skipped).
  std::optional<PeerSnapshot> fetch_own(std::chrono::milliseconds within);
  SnapshotSender& sender() { return *sender_; }
  SnapshotSender* second_sender() { return second_.get(); }  // null with one copy
  SnapshotHolder& holder() { return *holder_; }

 private:
  int slot_, slots_, every_, copies_;
  std::unique_ptr<comm::TcpStore> store_;
  std::unique_ptr<SnapshotHolder> holder_;
  std::unique_ptr<SnapshotSender> sender_, second_;
};

}  // namespace atl::resilience
