#include "resilience/lighthouse.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "comm/tcp_store.h"
#include "core/log.h"
#include "core/server_threads.h"
#include "resilience/line_socket.h"

namespace atl::resilience {

using Clock = std::chrono::steady_clock;

namespace {
struct Replica {
  std::string nonce;
  Clock::time_point last_hb;
  bool connected = false;  // heartbeat connection open
  bool ever_alive = false;
  bool finished = false;  // said F: its connection closing is not a failure
  int64_t step = 0;
  std::string phase;
};
struct Pending {
  std::string nonce;
  int64_t step = 0;
  bool need_new = false;
  std::string reply;  // set when the quorum is formed
  bool answered = false;
};
}  // namespace

struct Lighthouse::Impl {
  LighthouseOptions o;
  int listen_fd = -1, port = 0;
  std::unique_ptr<comm::TcpStoreServer> store;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<int, Replica> replicas;
  std::map<int, Pending> pending;
  int64_t quorum_id = 0;
  std::vector<std::pair<int, std::string>> members;  // (id, nonce) of the last quorum
  bool formed_once = false, stop = false;
  std::thread acceptor, monitor;
  ServerThreads conns;  // one per connection, joined as they finish
  std::vector<int> conn_fds;
  // DeadPool.
  std::deque<std::pair<int, std::string>> waiting;  // spares (id, nonce), oldest first
  std::map<std::string, int> assigned;              // spare nonce -> slot, until it is told
  std::map<int, std::pair<Clock::time_point, std::string>> refilling;  // slot -> (deadline, dead nonce)
  std::set<int> vacant;
  std::set<std::string> reported;  // dead incarnations already handled
  std::vector<std::pair<int, int>> swaps;

  bool all_slots_finished() const {
    for (int s = 0; s < o.slots; ++s) {
      auto r = replicas.find(s);
      if (r == replicas.end() || !r->second.finished) return false;
    }
    return o.slots > 0;
  }

  // Under mu: dead slots get waiting spares. True while a quorum must wait for a given spare.
  bool refill(Clock::time_point now) {
    if (o.slots <= 0) return false;
    for (auto& [id, r] : replicas) {
      if (id >= o.slots || !r.ever_alive || r.connected || r.finished || reported.count(r.nonce)) continue;
      reported.insert(r.nonce);
      vacant.insert(id);
      if (waiting.empty())
        log::warn("deadpool: replica {} is dead and no spare is left: the quorum goes on without it (the job "
                  "runs at reduced size until a spare registers)",
                  id);
    }
    for (auto it = vacant.begin(); it != vacant.end() && !waiting.empty();) {
      auto [spare, nonce] = waiting.front();
      waiting.pop_front();
      assigned[nonce] = *it;
      refilling[*it] = {now + o.refill_timeout, replicas[*it].nonce};
      swaps.push_back({*it, spare});
      log::info("deadpool: spare {} takes the place of replica {}", spare, *it);
      it = vacant.erase(it);
      cv.notify_all();
    }
    bool wait = false;
    for (auto it = refilling.begin(); it != refilling.end();) {
      if (now > it->second.first) {
        log::warn("deadpool: the spare for slot {} did not join within {} ms: the quorum goes on without it",
                  it->first, o.refill_timeout.count());
        vacant.insert(it->first);
        it = refilling.erase(it);
      } else {
        wait = true;
        ++it;
      }
    }
    return wait;
  }

  bool alive(const Replica& r, Clock::time_point now) const {
    return r.connected && now - r.last_hb <= o.heartbeat_timeout;
  }

  // Under mu: answer the pending requests when every alive replica has asked.
  void try_form(Clock::time_point now) {
    if (refill(now)) return;  // a spare is on its way: the job goes on at full size
    if (pending.empty()) return;
    std::vector<std::pair<int, std::string>> m;
    bool need_new = false;
    for (auto it = pending.begin(); it != pending.end();) {
      auto r = replicas.find(it->first);
      if (r == replicas.end() || !alive(r->second, now) || r->second.nonce != it->second.nonce) {
        ++it;  // a requester that is not (yet, or any more) alive waits
        continue;
      }
      m.push_back({it->first, it->second.nonce});
      need_new = need_new || it->second.need_new;
      ++it;
    }
    for (auto& [id, r] : replicas) {  // someone alive has not asked yet (a dead incarnation's ask does not count)
      if (!alive(r, now)) continue;
      auto p = pending.find(id);
      if (p == pending.end() || p->second.nonce != r.nonce) return;
    }
    if (m.empty()) return;
    if (!formed_once && int(m.size()) < o.min_replicas) return;
    if (m != members || need_new) ++quorum_id;
    members = m;
    formed_once = true;
    std::string list;
    for (auto& [id, nonce] : m)
      list += fmt::format("{}{}:{}:{}", list.empty() ? "" : ",", id, pending[id].step, nonce);
    std::string reply = fmt::format("Q {} {}", quorum_id, list);
    for (auto& [id, nonce] : m) {
      pending[id].reply = reply;
      pending[id].answered = true;
    }
    cv.notify_all();
  }

  void serve(int fd) {
    LineConn c(fd);
    int hb_id = -1;
    std::string hb_nonce;
    std::string line;
    while (c.read_line(line)) {
      std::istringstream in(line);
      std::string kind;
      in >> kind;
      if (kind == "HB") {
        int id;
        std::string nonce, phase;
        int64_t step = 0;
        in >> id >> nonce >> step >> phase;
        std::string alive_list;
        {
          std::lock_guard<std::mutex> lk(mu);
          auto now = Clock::now();
          Replica& r = replicas[id];
          if (r.nonce != nonce) {  // a new incarnation of this id (a restart, or the spare given the slot)
            r = Replica{};
            refilling.erase(id);
            vacant.erase(id);
          }
          r.nonce = nonce;
          r.last_hb = now;
          r.connected = true;
          r.ever_alive = true;
          r.step = step;
          r.phase = phase;
          hb_id = id;
          hb_nonce = nonce;
          for (auto& [i, x] : replicas)
            if (alive(x, now)) alive_list += fmt::format("{}{}:{}", alive_list.empty() ? "" : ",", i, x.nonce);
          try_form(now);
        }
        if (!c.send_line("A " + alive_list)) break;
      } else if (kind == "Q") {
        int id;
        std::string nonce;
        int64_t step = 0;
        int need_new = 0;
        in >> id >> nonce >> step >> need_new;
        std::string reply;
        {
          std::unique_lock<std::mutex> lk(mu);
          pending[id] = Pending{nonce, step, need_new != 0, "", false};
          try_form(Clock::now());
          // find, not []: a waiter whose entry a new incarnation took over must not re-create it.
          auto mine = [&] {
            auto p = pending.find(id);
            return p != pending.end() && p->second.nonce == nonce ? p : pending.end();
          };
          cv.wait(lk, [&] { return stop || mine() == pending.end() || mine()->second.answered; });
          auto p = mine();
          if (stop || p == pending.end()) break;
          reply = p->second.reply;
          pending.erase(p);
        }
        if (!c.send_line(reply)) break;
      } else if (kind == "F") {
        int id;
        std::string nonce;
        in >> id >> nonce;
        {
          std::lock_guard<std::mutex> lk(mu);
          auto r = replicas.find(id);
          if (r != replicas.end() && r->second.nonce == nonce) {
            r->second.finished = true;
            r->second.phase = "finished";
          }
          cv.notify_all();
        }
        if (!c.send_line("F")) break;
      } else if (kind == "SPARE") {
        int id;
        std::string nonce;
        in >> id >> nonce;
        int slot = -1;
        bool done = false;
        {
          std::unique_lock<std::mutex> lk(mu);
          waiting.push_back({id, nonce});
          refill(Clock::now());
          for (;;) {
            auto a = assigned.find(nonce);
            if (a != assigned.end()) {
              slot = a->second;
              assigned.erase(a);
              break;
            }
            if (stop) break;
            if (all_slots_finished()) {
              done = true;
              break;
            }
            cv.wait_for(lk, Millis(50));
            char ch;
            ssize_t k = ::recv(c.fd(), &ch, 1, MSG_PEEK | MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;  // it died
          }
          if (slot < 0) waiting.erase(std::remove(waiting.begin(), waiting.end(), std::make_pair(id, nonce)), waiting.end());
        }
        if (done) c.send_line("DONE");
        if (slot < 0 || !c.send_line(fmt::format("ASSIGN {}", slot))) break;
      } else if (kind == "S") {
        if (!c.send_line(fmt::format("S {}", store->port()))) break;
      } else if (kind == "W") {
        if (!c.send_line("W " + status())) break;
      } else {
        c.send_line("E unknown request '" + kind + "'");
      }
    }
    if (hb_id >= 0) {
      std::lock_guard<std::mutex> lk(mu);
      auto r = replicas.find(hb_id);
      if (r != replicas.end() && r->second.nonce == hb_nonce) r->second.connected = false;
      try_form(Clock::now());
    }
    {
      std::lock_guard<std::mutex> lk(mu);
      conn_fds.erase(std::remove(conn_fds.begin(), conn_fds.end(), c.fd()), conn_fds.end());
    }
  }

  std::string status() const {
    std::lock_guard<std::mutex> lk(mu);
    auto now = Clock::now();
    nlohmann::json j;
    j["quorum_id"] = quorum_id;
    std::vector<int> mem, stopped, dead;
    for (auto& [id, n] : members) mem.push_back(id);
    j["members"] = mem;
    j["replicas"] = nlohmann::json::array();
    for (auto& [id, r] : replicas) {
      bool a = alive(r, now);
      const char* state = a ? "alive" : r.connected ? "stopped" : "dead";
      if (!a) (r.connected ? stopped : dead).push_back(id);
      j["replicas"].push_back({{"id", id},
                               {"alive", a},
                               {"state", state},
                               {"last_heartbeat_ms", std::chrono::duration<double, std::milli>(now - r.last_hb).count()},
                               {"step", r.step},
                               {"phase", r.phase}});
    }
    j["stopped"] = stopped;
    j["dead"] = dead;
    std::vector<int> sp;
    for (auto& [id, n] : waiting) sp.push_back(id);
    j["spares"] = sp;
    j["vacant"] = std::vector<int>(vacant.begin(), vacant.end());
    j["swaps"] = swaps;
    return j.dump();
  }
};

Lighthouse::Lighthouse(const LighthouseOptions& o) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  I.o = o;
  I.port = o.port;
  I.listen_fd = listen_on(o.host, I.port);
  I.store = std::make_unique<comm::TcpStoreServer>(o.host, 0);
  I.acceptor = accept_loop(I.listen_fd, I.mu, I.stop, [&I](int fd) {
    I.conn_fds.push_back(fd);
    I.conns.start([&I, fd] { I.serve(fd); });
  });
  // Heartbeats that stop arriving change nothing by themselves: this notices them.
  I.monitor = std::thread([&I] {
    std::unique_lock<std::mutex> lk(I.mu);
    while (!I.stop) {
      I.cv.wait_for(lk, Millis(10));
      I.try_form(Clock::now());
    }
  });
}

Lighthouse::~Lighthouse() {
  auto& I = *impl_;
  {
    std::lock_guard<std::mutex> lk(I.mu);
    I.stop = true;
    for (int fd : I.conn_fds) ::shutdown(fd, SHUT_RDWR);
  }
  I.cv.notify_all();
  ::shutdown(I.listen_fd, SHUT_RDWR);
  ::close(I.listen_fd);
  I.acceptor.join();
  I.monitor.join();
  I.conns.join_all();
}

int Lighthouse::port() const { return impl_->port; }
int Lighthouse::store_port() const { return impl_->store->port(); }
std::string Lighthouse::status() const { return impl_->status(); }

}  // namespace atl::resilience
