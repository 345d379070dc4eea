// The lighthouse of fault-tolerant data parallelism (after torchft's design: Rice et al., PyTorch
// "torchft", 2025; quorum per step as in its Lighthouse/Manager pair): a small TCP server that
// every replica heartbeats (~100 ms) and asks, at each step boundary, for that step's quorum.
//
//  - Liveness: a replica is alive while its heartbeat connection is open and its last heartbeat is
//    younger than heartbeat_timeout. A closed connection (kill -9) counts at once; a silent one
//    (SIGSTOP, a hung host) after the timeout. Each heartbeat's reply is the alive set, so the
//    replicas learn of a death within one heartbeat and abort their in-flight collectives.
//  - Quorum: formed when every alive replica has asked (at least min_replicas before the first),
//    so a joiner enters exactly at a step boundary. Its id increases whenever its membership (or a
//    member's communicator) changes; each member's committed step travels with it, so replicas
//    behind the others know to heal and from whom.
//  - Observer: status() (the "W" request) names stopped (silent, connection open) and dead
//    (connection closed) replicas with their last step and phase; it answers from the lighthouse's
//    own threads whatever the trainers are doing.
// It also hosts the TCP store in which each quorum's Gloo communicator meets.
//
// Wire protocol, one line each way:
//   HB <id> <nonce> <step> <phase>   ->  A <id:nonce,id:nonce,...>
//   Q <id> <nonce> <step> <need_new> ->  Q <quorum_id> <id:step:nonce,...>   (when formed)
// Replicas are compared by incarnation (id and nonce): a spare that took a dead replica's id at
// once must not hide that replica's death from a peer still blocked on it.
//   S                                ->  S <store_port>
//   W                                ->  W <json>
//   F <id> <nonce>                   ->  F         (finished normally: its exit is not a failure)
//   SPARE <id> <nonce>               ->  ASSIGN <slot> | DONE   (DeadPool: when a slot needs it)
//
// DeadPool (slots > 0): replicas 0..slots-1 are the job's slots, spares wait in the pool with
// SPARE. A slot whose replica is dead (connection closed, not finished) is given the oldest waiting
// spare, and the next quorum waits for it (at most refill_timeout) so that the job goes on at full
// size; with no spare left the quorum goes on without the slot (torchft's behaviour) and the
// lighthouse says so. A stopped (silent) replica is not replaced: it may come back; the quorum
// leaves it out meanwhile.
#pragma once
#include <chrono>
#include <memory>
#include <string>

namespace atl::resilience {

struct LighthouseOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: pick a free one
  std::chrono::milliseconds heartbeat_timeout{300};
  int min_replicas = 1;  // replicas the first quorum waits for
  int slots = 0;         // DeadPool: the job's size; 0 = no spare pool
  std::chrono::milliseconds refill_timeout{15000};  // a quorum waits this long for a given spare
};

class Lighthouse {
 public:
  explicit Lighthouse(const LighthouseOptions& o);
  ~Lighthouse();
  int port() const;
  int store_port() const;
  // JSON: {"quorum_id":..,"members":[..],"replicas":[{"id","alive","state":"alive|stopped|dead",
  // "last_heartbeat_ms","step","phase"}],"stopped":[ids],"dead":[ids],
  //  "spares":[waiting ids],"vacant":[slots without a replica or spare],"swaps":[[slot,spare],..]}
  std::string status() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace atl::resilience
