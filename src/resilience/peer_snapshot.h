// DeadPool's in-memory peer checkpoints (issue 14 item 2; the "DeadPool" seed, after Gemini's
// in-memory checkpointing, Wang et al., SOSP 2023, and CheckFreq's snapshot/persist split, Mohan et
// al., FAST 2021): each rank's state lives, besides its own memory, in the memory of a peer (another
// host in production, another process here), so a spare that takes a dead rank's place restores it
// without touching a disk.
//
// Off the critical path, in two stages on two threads of the owner:
//   snapshot(step, parts)  the copy of the live state into a staging buffer starts at once and
//                          overlaps the next step's forward and backward (which only read it);
//   fence()                before the state changes again (the optimizer step): waits for that copy,
//                          normally long done;
//   the sender thread      checksums the staged copy and streams it to the holder.
// Double-buffered at both ends: the owner has two staging buffers and never refills the one being
// sent (a snapshot still waiting behind a send is superseded by a newer one); the holder receives
// into a separate buffer and replaces an owner's snapshot only by a complete one whose CRC-32C
// matches, so a sender killed mid-transfer leaves the previous complete snapshot in place.
//
// Wire protocol (one header line, then raw bytes):
//   PUT <owner> <step> <nbytes> <crc32c>\n<bytes>  ->  OK <step>  |  BAD <why>
//   GET <owner>\n                                  ->  SNAP <step> <nbytes> <crc32c>\n<bytes>  |  NONE
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace atl::resilience {

struct PeerSnapshot {
  int64_t step = -1;
  std::string blob;
};

// The peer's side: keeps the last complete snapshot of every owner that sends to it.
class SnapshotHolder {
 public:
  explicit SnapshotHolder(const std::string& host = "0.0.0.0", int port = 0);
  ~SnapshotHolder();
  int port() const;
  std::optional<PeerSnapshot> get(int owner) const;
  int64_t received() const;  // complete, verified snapshots taken
  int64_t rejected() const;  // cut or corrupt transfers refused

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The owner's side. `resolve_holder` gives the holder's "host:port"; it is asked again after a
// failed transfer (the holder may have died and been replaced by a spare at another address).
class SnapshotSender {
 public:
  SnapshotSender(int owner, std::function<std::string()> resolve_holder);
  ~SnapshotSender();
  using Part = std::pair<const void*, size_t>;
  // Starts copying parts (views of the live state, unchanged until fence()) for `step`; returns at
  // once. Skipped (counted as superseded) when the previous copy has not been fenced.
  void snapshot(int64_t step, std::vector<Part> parts);
  // The same with a serializer: `fill` runs on the copy thread and writes the snapshot into the
  // buffer it is given (reading only state that stays unchanged until fence()).
  void snapshot_with(int64_t step, std::function<void(std::string&)> fill);
  // Waits for the copy snapshot() started; returns the ms this call waited (the critical-path cost).
  double fence();
  // Waits until a holder has acknowledged `step` or a later snapshot, at most `within`.
  bool wait_acked(int64_t step, std::chrono::milliseconds within);
  struct Stats {
    int64_t copied = 0, sent = 0, superseded = 0, failures = 0, acked_step = -1;
    double copy_ms = 0, send_ms = 0, fence_wait_ms = 0;  // last copy, last send; total fence wait
  };
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A snapshot of `owner` from the holder at host:port (std::nullopt when it holds none); throws
// atl::Error when the holder cannot be reached within `within` or the transfer is bad.
std::optional<PeerSnapshot> fetch_snapshot(const std::string& host, int port, int owner,
                                           std::chrono::milliseconds within);

}  // namespace atl::resilience
