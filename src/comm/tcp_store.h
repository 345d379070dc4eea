// TCP key-value store: the rendezvous point of a job (torchrun's TCPStore role). One server,
// hosted by `atoll launch` on node 0 or by rank 0; every rank and launcher is a client.
//
// Besides set/get/add/wait it tracks liveness: a client that says hello(rank) and later loses its
// connection without saying goodbye (the process died) is recorded as dead, so that the other
// ranks' errors can name it. Values are arbitrary bytes.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace atl::comm {

class TcpStoreServer {
 public:
  // Binds host:port ("0.0.0.0" for all interfaces; port 0 picks a free one) and serves on
  // background threads until destroyed.
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

class TcpStore {
 public:
  using Millis = std::chrono::milliseconds;
  // Connects, retrying (the server may start after us) for connect_within, by default
  // connect_timeout(timeout), with a progress line every 10 s; `timeout` bounds every request.
  TcpStore(const std::string& host, int port, Millis timeout, Millis connect_within = Millis(-1));
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, const std::string& value);
  // Waits until the key exists, at most the store's timeout; throws atl::Error on timeout.
  std::string get(const std::string& key);
  std::optional<std::string> try_get(const std::string& key);
  // Adds delta to an integer counter (created at 0) and returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  // Throws atl::Error naming the missing keys when they do not all exist within `timeout`.
  void wait(const std::vector<std::string>& keys, Millis timeout);
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }
  bool check(const std::vector<std::string>& keys);
  // Registers this connection as rank `rank`'s lifeline; goodbye() ends it cleanly.
  void hello(int rank);
  void goodbye();
  // Ranks whose lifeline broke without a goodbye.
  std::vector<int> dead_ranks();

  Millis timeout() const { return timeout_; }
  const std::string& address() const { return address_; }

 private:
  std::string request(const std::string& msg, Millis reply_within);
  int fd_ = -1;
  Millis timeout_;
  std::string address_;
  std::mutex mu_;
};

// How long to keep trying to reach a peer or the store at start-up, apart from the collective
// timeout (a rank that never comes should not cost the full 300 s of a slow collective):
// ATOLL_CONNECT_TIMEOUT seconds when set, else the smaller of `collective` and 60 s.
std::chrono::milliseconds connect_timeout(std::chrono::milliseconds collective);

// A TCP port free on host, drawn below the kernel's ephemeral range so that no connection the
// machine opens meanwhile takes it before it is listened on: for tests and the single-node launcher.
int pick_free_port(const std::string& host = "127.0.0.1");

}  // namespace atl::comm
