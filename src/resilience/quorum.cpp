#include "resilience/quorum.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "comm/gloo_communicator.h"
#include "core/log.h"
#include "resilience/line_socket.h"

namespace atl::resilience {

using Clock = std::chrono::steady_clock;

static double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

QuorumOptions QuorumOptions::from_environment() {
  QuorumOptions o;
  if (const char* lh = std::getenv("ATOLL_LIGHTHOUSE")) {
    std::string s = lh;
    auto colon = s.rfind(':');
    ATOLL_CHECK(colon != std::string::npos && colon > 0, "ATOLL_LIGHTHOUSE='{}' is not HOST:PORT", s);
    o.lighthouse_host = s.substr(0, colon);
    o.lighthouse_port = std::atoi(s.c_str() + colon + 1);
    ATOLL_CHECK(o.lighthouse_port > 0 && o.lighthouse_port < 65536, "ATOLL_LIGHTHOUSE='{}': bad port", s);
  }
  const char* id = std::getenv("ATOLL_REPLICA_ID");
  if (!id) id = std::getenv("RANK");
  if (id) o.replica_id = std::atoi(id);
  if (const char* hb = std::getenv("ATOLL_FT_HEARTBEAT_MS")) o.heartbeat = Millis(std::max(10, std::atoi(hb)));
  return o;
}

// The heartbeat: its own connection and thread, so it keeps going while the trainer is blocked.
struct QuorumReplica::Heartbeat {
  QuorumOptions o;
  std::string nonce;
  LineConn conn;
  std::thread th;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false, lost = false;
  int64_t step = 0;
  std::string phase = "start";
  comm::Communicator* comm = nullptr;  // the current quorum's
  std::vector<std::string> members;  // "id:nonce": incarnations, not ids
  // Bumped when comm changes: an alive set asked for before the current quorum formed may lack a
  // member that joined it (a spare) and must not abort the new communicator.
  uint64_t gen = 0;
  bool first_reply = false;

  void loop() {
    std::unique_lock<std::mutex> lk(mu);
    while (!stop) {
      std::string msg = fmt::format("HB {} {} {} {}", o.replica_id, nonce, step, phase.empty() ? "-" : phase);
      const uint64_t sent_gen = gen;
      lk.unlock();
      std::string reply;
      bool ok = conn.send_line(msg) && conn.read_line(reply, o.heartbeat * 50);
      lk.lock();
      if (!ok) {
        if (!stop) log::warn("replica {}: lost the lighthouse", o.replica_id);
        lost = true;
        if (comm) comm->abort("the lighthouse is unreachable");
        cv.notify_all();
        return;
      }
      first_reply = true;
      cv.notify_all();
      std::vector<std::string> alive;
      std::istringstream in(reply.size() > 2 ? reply.substr(2) : "");
      for (std::string tok; std::getline(in, tok, ',');)
        if (!tok.empty()) alive.push_back(tok);
      if (comm && !comm->aborted() && sent_gen == gen) {
        std::string gone;
        for (const std::string& m : members)
          if (!std::count(alive.begin(), alive.end(), m))
            gone += fmt::format("{}{}", gone.empty() ? "" : ", ", m.substr(0, m.find(':')));
        if (!gone.empty()) comm->abort(fmt::format("replica {} missed its heartbeats (the lighthouse says)", gone));
      }
      cv.wait_for(lk, o.heartbeat, [&] { return stop; });
    }
  }
};

QuorumReplica::QuorumReplica(const QuorumOptions& o) : o_(o) {
  ATOLL_CHECK(o.lighthouse_port > 0, "fault tolerance: no lighthouse (set [fault] lighthouse or ATOLL_LIGHTHOUSE)");
  std::random_device rd;
  nonce_ = fmt::format("{}-{:x}", ::getpid(), (uint64_t(rd()) << 32) ^ rd());
  // The store where each quorum's communicator meets.
  {
    LineConn c(connect_to(o.lighthouse_host, o.lighthouse_port, o.connect_within));
    std::string r;
    ATOLL_CHECK(c.send_line("S") && c.read_line(r, o.connect_within) && r.rfind("S ", 0) == 0,
                "lighthouse {}:{} did not answer", o.lighthouse_host, o.lighthouse_port);
    store_port_ = std::atoi(r.c_str() + 2);
    store_host_ = o.lighthouse_host;
  }
  hb_ = std::make_unique<Heartbeat>();
  hb_->o = o;
  hb_->nonce = nonce_;
  hb_->conn = LineConn(connect_to(o.lighthouse_host, o.lighthouse_port, o.connect_within));
  hb_->th = std::thread([h = hb_.get()] { h->loop(); });
  std::unique_lock<std::mutex> lk(hb_->mu);
  hb_->cv.wait(lk, [&] { return hb_->first_reply || hb_->lost; });  // alive before asking for a quorum
  ATOLL_CHECK(!hb_->lost, "lighthouse {}:{} did not answer the first heartbeat", o.lighthouse_host,
              o.lighthouse_port);
}

QuorumReplica::~QuorumReplica() {
  {
    std::lock_guard<std::mutex> lk(hb_->mu);
    hb_->stop = true;
    hb_->comm = nullptr;
  }
  hb_->cv.notify_all();
  hb_->conn.shutdown();
  hb_->th.join();
  comm_.reset();
  // Retired communicators were aborted; their workers have returned (retire_comm waited), or not.
  for (auto& c : retired_) c.release();  // never block an exit on a stuck backend call
}

void QuorumReplica::set_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lk(hb_->mu);
  hb_->phase = phase;
}

void QuorumReplica::retire_comm() {
  {
    std::lock_guard<std::mutex> lk(hb_->mu);
    hb_->comm = nullptr;
    hb_->members.clear();
    ++hb_->gen;
  }
  if (!comm_) return;
  comm_->abort("replaced by a new quorum");
  // An operation queued behind the aborted one completes only once the worker has left it, so the
  // caller's tensors are no longer written by the old collective (bounded: a stuck call is left).
  auto w = comm_->barrier_async();
  auto t0 = Clock::now();
  while (!w->done() && ms_since(t0) < 2000) std::this_thread::sleep_for(Millis(1));
  if (!w->done()) {
    log::warn("replica {}: an aborted collective has not returned after 2 s", o_.replica_id);
    retired_.push_back(std::move(comm_));  // kept, never destroyed: its worker may still be in the backend
    return;
  }
  // The worker has left the backend: the old communicator goes now, with its threads, its peers'
  // sockets and its store connection (kept, a job reconfigured a thousand times held a thousand of
  // each, here and in the launcher's store).
  comm_.reset();
}

void QuorumReplica::join_quorum(ReplicaState& state) {
  auto t0 = Clock::now();
  const bool need_new = comm_failed_ || !comm_;
  LineConn c(connect_to(o_.lighthouse_host, o_.lighthouse_port, o_.connect_within));
  std::string reply;
  ATOLL_CHECK(c.send_line(fmt::format("Q {} {} {} {}", o_.replica_id, nonce_, state.step, need_new ? 1 : 0)) &&
                  c.read_line(reply) && reply.rfind("Q ", 0) == 0,
              "replica {}: the lighthouse {}:{} did not answer the quorum request for step {}", o_.replica_id,
              o_.lighthouse_host, o_.lighthouse_port, state.step + 1);
  std::istringstream in(reply.substr(2));
  int64_t qid = 0;
  std::string list;
  in >> qid >> list;
  std::vector<int> ids;
  std::vector<int64_t> steps;
  std::vector<std::string> incarnations;  // id:nonce
  std::istringstream li(list);
  list.clear();  // for the log: id:step
  for (std::string tok; std::getline(li, tok, ',');) {
    auto c1 = tok.find(':'), c2 = tok.find(':', c1 + 1);
    ids.push_back(std::atoi(tok.substr(0, c1).c_str()));
    steps.push_back(std::atoll(tok.substr(c1 + 1, c2 - c1 - 1).c_str()));
    incarnations.push_back(tok.substr(0, c1) + ":" + (c2 == std::string::npos ? "" : tok.substr(c2 + 1)));
    list += fmt::format("{}{}:{}", list.empty() ? "" : ",", ids.back(), steps.back());
  }
  auto me = std::find(ids.begin(), ids.end(), o_.replica_id);
  ATOLL_CHECK(me != ids.end(), "replica {}: quorum {} does not include it", o_.replica_id, qid);
  int rank = int(me - ids.begin());
  if (qid != quorum_id_ || need_new) {
    retire_comm();
    comm_failed_ = true;  // until the new one is up
    comm_ = comm::GlooCommunicator::create_group(store_host_, store_port_, rank, ids, fmt::format("ft/q{}/", qid),
                                                 o_.comm_timeout, o_.connect_within);
    comm_failed_ = false;
    quorum_id_ = qid;
    members_ = ids;
    {
      std::lock_guard<std::mutex> lk(hb_->mu);
      hb_->comm = comm_.get();
      hb_->members = incarnations;
      ++hb_->gen;
    }
    ++stats_.reconfigurations;
    stats_.last_reconfigure_ms = ms_since(t0);
    log::info("replica {}: quorum {} of {} replicas ({}) for step {}", o_.replica_id, qid, ids.size(), list,
              state.step + 1);
    if (o_.slots > 0 && int(ids.size()) < o_.slots) {
      std::string missing;
      for (int sl = 0; sl < o_.slots; ++sl)
        if (!std::count(ids.begin(), ids.end(), sl)) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", sl);
      log::warn("replica {}: deadpool: no spare left for slot(s) {}: quorum {} goes on with {} of {} slots "
                "(their share of the batch is skipped)",
                o_.replica_id, missing, qid, ids.size(), o_.slots);
    }
  }
  int64_t target = *std::max_element(steps.begin(), steps.end());
  if (std::any_of(steps.begin(), steps.end(), [&](int64_t s) { return s != target; })) {
    int source = int(std::find(steps.begin(), steps.end(), target) - steps.begin());
    heal(state, source, target);
  }
}

void QuorumReplica::heal(ReplicaState& state, int source, int64_t target) {
  auto t0 = Clock::now();
  const bool behind = state.step != target;
  if (state.before_write) state.before_write();
  for (Tensor& t : state.tensors) comm_->broadcast(t, source);
  std::string blob = comm_->rank() == source && state.save_extra ? state.save_extra() : std::string();
  Tensor len = Tensor::empty({1}, DType::i64);
  len.data<int64_t>()[0] = int64_t(blob.size());
  comm_->broadcast(len, source);
  int64_t n = len.data<int64_t>()[0];
  Tensor bytes = Tensor::zeros({std::max<int64_t>(1, (n + 7) / 8)}, DType::i64);
  if (comm_->rank() == source) std::memcpy(bytes.raw(), blob.data(), size_t(n));
  comm_->broadcast(bytes, source);
  if (behind) {
    blob.assign(static_cast<const char*>(bytes.raw()), size_t(n));
    if (state.load_extra) state.load_extra(blob);
    if (state.advance_own) state.advance_own(state.step, target);
    log::info("replica {}: healed from replica {} at step {} (was at {}) in {:.0f} ms", o_.replica_id,
              members_[size_t(source)], target, state.step, ms_since(t0));
    state.step = target;
    ++stats_.heals;
    stats_.last_heal_ms = ms_since(t0);
  }
}

void QuorumReplica::finish(const ReplicaState& state) {
  set_phase("finished");
  LineConn c(connect_to(o_.lighthouse_host, o_.lighthouse_port, o_.connect_within));
  std::string reply;
  // Said first, so that the lighthouse does not take our exit for a failure (DeadPool: no spare
  // must take a finished replica's place).
  if (!c.send_line(fmt::format("F {} {}", o_.replica_id, nonce_)) || !c.read_line(reply, o_.connect_within))
    log::warn("replica {}: the lighthouse did not answer the finish notice", o_.replica_id);
  if (!c.send_line(fmt::format("Q {} {} {} 0", o_.replica_id, nonce_, state.step)) || !c.read_line(reply))
    log::warn("replica {}: the lighthouse did not answer the final quorum request", o_.replica_id);
}

bool QuorumReplica::step(ReplicaState& state, const std::function<void(comm::Communicator&)>& compute,
                         const std::function<void()>& apply) {
  try {
    set_phase("quorum");
    join_quorum(state);
    {
      std::lock_guard<std::mutex> lk(hb_->mu);
      hb_->step = state.step;
      hb_->phase = "compute";
    }
    compute(*comm_);
    set_phase("commit");
    Tensor vote = Tensor::empty({1}, DType::i64);
    vote.data<int64_t>()[0] = 1;
    comm_->all_reduce(vote);
    ATOLL_CHECK(vote.data<int64_t>()[0] == comm_->size(), "commit vote: {} of {} members", vote.data<int64_t>()[0],
                comm_->size());
  } catch (const std::exception& e) {
    if (hb_->lost) throw;
    // A step that fails again and again is not a peer's failure but this replica's own (bad data, a
    // bug): give up instead of retrying forever.
    if (++consecutive_discards_ > 20) throw;
    comm_failed_ = true;
    ++stats_.discarded;
    if (!recovering_) failed_at_ = Clock::now();
    recovering_ = true;
    log::warn("replica {}: step {} discarded on quorum {}: {}", o_.replica_id, state.step + 1, quorum_id_, e.what());
    return false;
  }
  consecutive_discards_ = 0;
  apply();
  ++state.step;
  ++stats_.committed;
  set_phase("apply");
  if (recovering_) {
    recovering_ = false;
    stats_.last_recovery_ms = ms_since(failed_at_);
    log::info("replica {}: step {} committed on quorum {} ({} members) {:.0f} ms after the failure was noticed "
              "(wall clock {} ms)",
              o_.replica_id, state.step, quorum_id_, members_.size(), stats_.last_recovery_ms,
              std::chrono::duration_cast<Millis>(std::chrono::system_clock::now().time_since_epoch()).count());
  }
  std::lock_guard<std::mutex> lk(hb_->mu);
  hb_->step = state.step;
  return true;
}

}  // namespace atl::resilience
