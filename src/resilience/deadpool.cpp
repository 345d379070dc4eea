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
                                   const std::string& advertise_host, int copies)
    : slot_(slot), slots_(slots), every_(every), copies_(copies) {
  ATOLL_CHECK(slots >= 2 && slot >= 0 && slot < slots, "deadpool: slot {} of {} (needs 2 slots or more)", slot,
              slots);
  ATOLL_CHECK(every >= 1, "deadpool: snapshot every {} steps (must be >= 1)", every);
  ATOLL_CHECK(copies == 1 || (copies == 2 && slots >= 3),
              "deadpool: {} snapshot copies with {} slots (1, or 2 with 3 slots or more: the copies go to the "
              "next two slots)", copies, slots);
  store_ = std::make_unique<comm::TcpStore>(lh_host, lighthouse_store_port(lh_host, lh_port), Millis(2000),
                                            Millis(10000));
  holder_ = std::make_unique<SnapshotHolder>("0.0.0.0", 0);
  store_->set(holder_key(slot), fmt::format("{}:{}", advertise_host, holder_->port()));
  int next = (slot + 1) % slots;
  sender_ = std::make_unique<SnapshotSender>(slot, [this, next] { return store_->get(holder_key(next)); });
  if (copies == 2) {
    int after = (slot + 2) % slots;
    second_ = std::make_unique<SnapshotSender>(slot, [this, after] { return store_->get(holder_key(after)); });
  }
}

PeerCheckpointer::~PeerCheckpointer() {
  second_.reset();
  sender_.reset();
  holder_.reset();
}

void PeerCheckpointer::after_commit(int64_t step, std::vector<SnapshotSender::Part> parts) {
  if (step % every_ != 0) return;
  if (second_) second_->snapshot(step, parts);
  sender_->snapshot(step, std::move(parts));
}

void PeerCheckpointer::after_commit(int64_t step, std::function<void(std::string&)> fill) {
  if (step % every_ != 0) return;
  if (second_) second_->snapshot_with(step, fill);
  sender_->snapshot_with(step, std::move(fill));
}

std::optional<PeerSnapshot> PeerCheckpointer::fetch_own(Millis within) {
  auto from = [&](int holder, Millis w) {
    std::string addr = store_->get(holder_key(holder));
    auto colon = addr.rfind(':');
    ATOLL_CHECK(colon != std::string::npos, "deadpool: bad holder address '{}'", addr);
    return fetch_snapshot(addr.substr(0, colon), std::atoi(addr.c_str() + colon + 1), slot_, w);
  };
  if (copies_ == 1) return from((slot_ + 1) % slots_, within);
  // Either holder may be gone with the slot (two neighbours lost together): the newer of the
  // snapshots that can be had, each holder given half the time.
  std::optional<PeerSnapshot> best;
  std::string errors;
  int failed = 0;
  for (int k : {1, 2}) {
    const int holder = (slot_ + k) % slots_;
    try {
      auto s = from(holder, within / 2);
      if (s && (!best || s->step > best->step)) best = std::move(s);
    } catch (const Error& e) {
      ++failed;
      errors += fmt::format("{}slot {}'s holder: {}", errors.empty() ? "" : "; ", holder, e.what());
    }
  }
  if (!errors.empty()) log::warn("deadpool: slot {}: {}{}", slot_, errors,
                                 best ? fmt::format("; restored from the other copy (step {})", best->step) : "");
  ATOLL_CHECK(failed < 2,
              "deadpool: neither holder of slot {}'s snapshot answered: {}", slot_, errors);
  return best;
}

}  // namespace atl::resilience
