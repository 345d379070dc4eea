// A server's threads, one per connection, joined as they finish. A std::thread that has returned
// but was never joined still holds its stack (8 MiB of address space and two memory mappings): a
// server that keeps every connection's thread until it is destroyed — the lighthouse and the
// rendezvous store see new connections every step of a fault-tolerant job — ran out of mappings
// after ~8000 steps of a 4-replica job (vm.max_map_count 65530) and died in std::thread's
// constructor with EAGAIN. Here each start() first joins the threads that have finished.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace atl {

class ServerThreads {
 public:
  ServerThreads() = default;
  ServerThreads(const ServerThreads&) = delete;
  ServerThreads& operator=(const ServerThreads&) = delete;
  ~ServerThreads() { join_all(); }

  // Runs fn on a thread of its own (after joining those that are done).
  void start(std::function<void()> fn);
  // Joins every thread (the owner first makes them return: shuts their sockets down).
  void join_all();
  // Threads started and not yet joined, finished or not (for tests).
  size_t held() const;

 private:
  void reap();
  mutable std::mutex mu_;
  std::map<uint64_t, std::thread> threads_;
  std::vector<uint64_t> done_;
  uint64_t next_ = 0;
};

}  // namespace atl
