// The message exchange of gradient coding in a data-parallel loop (coded_data_parallel.h): every
// rank sends its coded message for a step to every other rank, and a rank goes on as soon as k of
// the n messages are in, whichever they are — what a collective cannot do (an all-reduce waits for
// its slowest member). Point-to-point TCP beside the communicator: one connection per ordered pair,
// a sender thread per peer with a bounded queue (a stopped peer's backlog is dropped, never waited
// on), a reader thread per incoming connection filling a mailbox keyed by step.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace atl::resilience {

class CodedExchange {
 public:
  using Messages = std::map<int, std::vector<float>>;  // rank -> payload
  // Collective over `comm` (only here, to trade addresses): listens on `host`, connects to every peer.
  explicit CodedExchange(comm::Communicator& comm, const std::string& host = "127.0.0.1");
  ~CodedExchange();  // flushes what is queued (at most ~2 s per peer), then closes
  CodedExchange(const CodedExchange&) = delete;
  CodedExchange& operator=(const CodedExchange&) = delete;

  int rank() const;
  int size() const;
  // This rank's message for `step`: into its own mailbox and queued to every peer (never blocks).
  void post(int64_t step, std::vector<float> msg);
  // Waits until `k` ranks' messages for `step` are in (or `timeout`: throws atl::Error naming the
  // ranks that were missing) and returns every message of that step in by then.
  Messages collect(int64_t step, int k, std::chrono::milliseconds timeout);
  // What is in for `step` now, without waiting.
  Messages peek(int64_t step);
  // Drops every message of steps before `step` (a late straggler's, or consumed ones).
  void forget_before(int64_t step);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace atl::resilience
