#include "resilience/deadpool.h"

#include <unistd.h>

#include <random>

#include "comm/tcp_store.h"
#include "core/error.h"
#include "core/log.h"
#include "resilience/line_socket.h"

namespace atl::resilience {

static std::string holder_key(int slot) { return "deadpool/holder/" + std::to_string(slot); }

static int lighthouse_store_port(const std::string& host, int port) {
  LineConn c(connect_to(host, port, Millis(10000)));
  std::string r;
  ATOLL_CHECK(c.send_line("S") && c.read_line(r, Millis(10000)) && r.rfind("S ", 0) == 0,
              "lighthouse {}:{} did not answer", host, port);
  return std::atoi(r.c_str() + 2);
}

int wait_for_slot(const std::string& host, int port, int spare_id, Millis within) {
  std::random_device rd;
  std::string nonce = fmt::format("spare{}-{}-{:x}", spare_id, ::getpid(), rd());
  LineConn c(connect_to(host, port, Millis(10000)));
  if (!c.send_line(fmt::format("SPARE {} {}", spare_id, nonce))) return -1;
  log::info("spare {}: waiting in the pool of lighthouse {}:{}", spare_id, host, port);
  std::string r;
  if (!c.read_line(r, within)) return -1;
  if (r.rfind("ASSIGN ", 0) != 0) return -1;  // DONE: the job finished without needing it
  int slot = std::atoi(r.c_str() + 7);
  log::info("spare {}: takes the place of slot {}", spare_id, slot);
  return slot;
}

PeerCheckpointer::PeerCheckpointer(const std::string& lh_host, int lh_port, int slot, int slots, int every,
                                   const std::string& advertise_host)
    : slot_(slot), slots_(slots), every_(every) {
  ATOLL_CHECK(slots >= 2 && slot >= 0 && slot < slots, "deadpool: slot {} of {} (needs 2 slots or more)", slot,
              slots);
  ATOLL_CHECK(every >= 1, "deadpool: snapshot every {} steps (must be >= 1)", every);
  store_ = std::make_unique<comm::TcpStore>(lh_host, lighthouse_store_port(lh_host, lh_port), Millis(2000),
                                            Millis(10000));
  holder_ = std::make_unique<SnapshotHolder>("0.0.0.0", 0);
  store_->set(holder_key(slot), fmt::format("{}:{}", advertise_host, holder_->port()));
  int next = (slot + 1) % slots;
  sender_ = std::make_unique<SnapshotSender>(slot, [this, next] { return store_->get(holder_key(next)); });
}

PeerCheckpointer::~PeerCheckpointer() {
  sender_.reset();
  holder_.reset();
}

void PeerCheckpointer::after_commit(int64_t step, std::vector<SnapshotSender::Part> parts) {
  if (step % every_ == 0) sender_->snapshot(step, std::move(parts));
}

void PeerCheckpointer::after_commit(int64_t step, std::function<void(std::string&)> fill) {
  if (step % every_ == 0) sender_->snapshot_with(step, std::move(fill));
}

std::optional<PeerSnapshot> PeerCheckpointer::fetch_own(Millis within) {
  std::string addr = store_->get(holder_key((slot_ + 1) % slots_));
  auto colon = addr.rfind(':');
  ATOLL_CHECK(colon != std::string::npos, "deadpool: bad holder address '{}'", addr);
  return fetch_snapshot(addr.substr(0, colon), std::atoi(addr.c_str() + colon + 1), slot_, within);
}

}  // namespace atl::resilience
