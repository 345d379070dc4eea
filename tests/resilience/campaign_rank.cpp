// The campaign's rank program (campaign_toy.h): one rank of the toy job, with the faults it fires.
#include "campaign_toy.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "core/checksum.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "fault_hook_comm.h"
#include "ft_toy.h"
#include "proc.h"
#include "resilience/checkpoint.h"
#include "resilience/checkpoint_select.h"
#include "resilience/line_socket.h"
#include "resilience/phase_guard.h"
#include "resilience/scout_replay.h"
#include "resilience/step_signature.h"

namespace atl::resilience::test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Long enough that a loaded 2-core machine never trips it in a clean run, short enough that the
// three faults that wait for it (timeout, message drop, partition) cost seconds, not minutes.
constexpr auto kCommTimeout = std::chrono::milliseconds(2500);
constexpr int kWords = 2 + kDim / 2;  // a gradient message: seq, CRC-32C, kDim floats

// A receive that failed names the peer it waited on (the evidence the driver votes on).
struct PeerFailure : std::runtime_error {
  int peer;
  PeerFailure(int p, const std::string& what) : std::runtime_error(what), peer(p) {}
};

// The campaign's own heartbeat client (the lighthouse's HB line): step and phase, every 100 ms,
// from its own thread, so that it stops only when the whole process does.
class Heartbeat {
 public:
  Heartbeat(const std::string& host, int port, int id) : id_(id), nonce_(std::to_string(::getpid())) {
    conn_ = LineConn(connect_to(host, port, std::chrono::seconds(10)));
    th_ = std::thread([this] {
      while (!stop_) {
        std::string msg;
        {
          std::lock_guard<std::mutex> lk(mu_);
          msg = fmt::format("HB {} {} {} {}", id_, nonce_, step_, phase_);
        }
        std::string reply;
        if (!conn_.send_line(msg) || !conn_.read_line(reply, std::chrono::seconds(5))) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  ~Heartbeat() {
    stop_ = true;
    conn_.shutdown();
    th_.join();
  }
  void set(int64_t step, const std::string& phase) {
    std::lock_guard<std::mutex> lk(mu_);
    step_ = step;
    phase_ = phase;
  }

 private:
  int id_;
  std::string nonce_;
  LineConn conn_;
  std::mutex mu_;
  int64_t step_ = 0;
  std::string phase_ = "start";
  std::atomic<bool> stop_{false};
  std::thread th_;
};

// The loader: at step s it serves data position s, unless a fault moved it.
struct Loader {
  int64_t cursor = 1;
  std::deque<int64_t> queue;
  int64_t take() {
    if (queue.empty()) queue.push_back(cursor++);
    int64_t p = queue.front();
    queue.pop_front();
    return p;
  }
  void realign(int64_t next_step) {
    queue.clear();
    cursor = next_step;
  }
};

struct State {
  std::vector<float> w = std::vector<float>(kDim, 0.f), v = std::vector<float>(kDim, 0.f);
  float lr = 0.05f;
  uint64_t hash() const {
    uint64_t h = buffer_hash(w.data(), w.size() * 4) * 31 + buffer_hash(v.data(), v.size() * 4);
    return h * 31 + buffer_hash(&lr, 4);
  }
};

// Share q of n of data position p, computed from weights w.
std::vector<float> share_grad(const std::vector<float>& w, int64_t p, int q, int n) {
  ToyModel m;
  m.w = w;
  return m.grad(p, q * kG / n, (q + 1) * kG / n);
}

void emit(int64_t step, const std::string& detector, const Localization& l, const std::string& detail) {
  if (l.verdict == Localization::clean) return;
  std::printf("detect %lld %s %s %s | %s\n", static_cast<long long>(step), detector.c_str(), verdict_name(l.verdict),
              ranks_str(l.ranks).c_str(), detail.c_str());
  std::fflush(stdout);
}

void exhaust_memory() {
  // The address space capped a little above what the process maps now; then allocate (and touch)
  // until the allocator gives up, as a leak would on a full node.
  std::ifstream f("/proc/self/statm");
  size_t pages = 0;
  f >> pages;
  rlimit rl{};
  rl.rlim_cur = rl.rlim_max = pages * size_t(::sysconf(_SC_PAGESIZE)) + (256u << 20);
  ::setrlimit(RLIMIT_AS, &rl);
  std::vector<std::unique_ptr<char[]>> held;
  size_t mb = 0;
  try {
    for (;;) {
      held.emplace_back(new char[16u << 20]);
      std::memset(held.back().get(), 1, 16u << 20);
      mb += 16;
    }
  } catch (const std::bad_alloc&) {
  }
  held.clear();
  throw std::runtime_error(fmt::format("resource exhaustion: out of memory after {} MB", mb));
}

}  // namespace

int campaign_rank_program() {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no rank outlives a driver that was killed (a test timeout)
  ::signal(SIGXFSZ, SIG_IGN);  // a write past RLIMIT_FSIZE then fails with EFBIG instead of killing us
  const std::string path = std::getenv("ATOLL_CAMPAIGN"), dir = std::getenv("ATOLL_CAMPAIGN_DIR");
  const int first = std::atoi(std::getenv("ATOLL_CAMPAIGN_FIRST"));
  const int64_t start = std::atoll(std::getenv("ATOLL_CAMPAIGN_START"));
  const int lh_port = std::atoi(std::getenv("ATOLL_CAMPAIGN_LIGHTHOUSE"));
  // The namespace test bed (bench/fault_campaign.sh with NETNS=1): every rank in a network namespace
  // of its own, its link IFACE on a bridge, the driver and its lighthouse behind the bridge.
  const char* lh_env = std::getenv("ATOLL_CAMPAIGN_LIGHTHOUSE_HOST");
  const std::string lh_host = lh_env ? lh_env : "127.0.0.1";
  const char* iface = std::getenv("ATOLL_CAMPAIGN_IFACE");
  if (iface) {  // a link a partition took down comes back with the restart
    ATOLL_CHECK(std::system(fmt::format("ip link set {} up", iface).c_str()) == 0, "cannot bring {} up", iface);
  }
  std::unique_ptr<Heartbeat> hb;
  int64_t s = start;
  try {
    auto inner = comm::make_communicator("gloo", std::chrono::milliseconds(30000));
    inner->set_timeout(kCommTimeout);
    FaultHookCommunicator comm(std::move(inner));
    const int r = comm.rank(), n = comm.size();
    const Campaign c = parse_campaign(read_file(path), n, path);
    hb = std::make_unique<Heartbeat>(lh_host, lh_port, r);
    const std::string mine = fmt::format("{}/rank{}", dir, r), scratch = mine + "/scratch";
    if (fs::exists(scratch) && !fs::is_directory(scratch)) fs::remove(scratch);  // back after a restart
    fs::create_directories(scratch);
    CheckpointStore store(mine + "/ckpt", 3);
    State st;
    auto load = [&](int64_t step) {
      Checkpoint ck = CheckpointStore::load(fmt::format("{}/ckpt/step_{:08d}", mine, step));
      std::memcpy(st.w.data(), ck.model.at(0).second.raw(), kDim * 4);
      std::memcpy(st.v.data(), ck.optimizer.at(0).second.raw(), kDim * 4);
      st.lr = ck.state.at("lr").get<float>();
    };
    auto save = [&](int64_t step) {
      Checkpoint ck;
      Tensor w = Tensor::empty({kDim}, DType::f32), v = Tensor::empty({kDim}, DType::f32);
      std::memcpy(w.raw(), st.w.data(), kDim * 4);
      std::memcpy(v.raw(), st.v.data(), kDim * 4);
      ck.model = {{"w", w}};
      ck.optimizer = {{"v", v}};
      ck.state = {{"step", step}, {"sample_rng", nlohmann::json::array()},
                  {"train_data", {{"cursor", step + 1}}}, {"lr", st.lr}};
      store.save(step, ck);
    };
    int64_t last_saved = -1;
    if (start > 0) {
      load(start);
      last_saved = start;
    }
    Loader loader;
    loader.realign(start + 1);
    std::deque<State> history;  // the states the last steps started from (stale_state)
    std::set<int> fired;
    std::printf("rank %d of %d: steps %lld..%lld, faults from #%d\n", r, n, static_cast<long long>(start + 1),
                static_cast<long long>(c.steps), first);
    std::fflush(stdout);

    for (s = start + 1; s <= c.steps; ++s) {
      hb->set(s, "boundary");
      std::string phase = "step";
      int delay_ms = 0;
      bool stall = false, io_error = false;
      for (auto& f : c.faults) {
        if (f.step != s || f.index < first || fired.count(f.index) ||
            !std::count(f.ranks.begin(), f.ranks.end(), r))
          continue;
        fired.insert(f.index);
        std::printf("inject %lld %s at %lld\n", static_cast<long long>(s), f.type.c_str(),
                    static_cast<long long>(wall_ms()));
        std::fflush(stdout);
        const std::string& t = f.type;
        std::string ck = last_saved >= 0 ? fmt::format("{}/ckpt/step_{:08d}", mine, last_saved) : "";
        if (t == "tensor_corruption") {
          uint32_t b;
          std::memcpy(&b, &st.w[3], 4);
          b ^= 1u << 22;
          std::memcpy(&st.w[3], &b, 4);
        } else if (t == "stale_state") {
          if (!history.empty()) st = history.front();
        } else if (t == "drop") {
          loader.cursor++;
        } else if (t == "duplicate") {
          loader.cursor--;
        } else if (t == "reorder") {
          loader.queue = {loader.cursor + 1, loader.cursor};
          loader.cursor += 2;
        } else if (t == "config_drift") {
          st.lr *= 1.5f;
        } else if (t == "delay") {
          delay_ms = 800;
        } else if (t == "hang") {
          ::raise(SIGSTOP);
        } else if (t == "timeout") {
          stall = true;
        } else if (t == "exception") {
          throw std::runtime_error("injected exception in the step");
        } else if (t == "resource_exhaustion") {
          exhaust_memory();
        } else if (t == "process_termination") {
          ::raise(SIGKILL);
        } else if (t == "resource_unavailable") {
          fs::remove_all(scratch);
          std::ofstream(scratch) << "not a directory\n";
        } else if (t == "checkpoint_corruption" || t == "checkpoint_truncation") {
          std::string mf = ck + "/model.safetensors";
          std::string bytes = read_file(mf);
          if (t == "checkpoint_corruption")
            bytes[bytes.size() - 9] ^= 0x01;  // inside the tensor data
          else
            bytes.resize(bytes.size() / 2);
          std::ofstream(mf, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
        } else if (t == "checkpoint_missing") {
          fs::remove_all(ck);
        } else if (t == "checkpoint_io_error") {
          io_error = true;
        } else if (t == "payload_corruption") {
          comm.corrupt_sends = n - 1;
        } else if (t == "collective_desync") {
          phase = "eval";
        } else if (t == "message_drop") {
          comm.drop_sends = n - 1;
        } else if (t == "network_partition") {
          if (iface)  // the real thing: the rank's link goes down
            ATOLL_CHECK(std::system(fmt::format("ip link set {} down", iface).c_str()) == 0, "cannot take {} down", iface);
          else
            comm.partitioned = true;  // at the communicator: no namespace test bed here
        }
      }
      {  // the node-local spool every step writes to (resource_unavailable takes it away)
        std::ofstream spool(scratch + "/spool", std::ios::app);
        if (!spool)
          throw std::runtime_error(fmt::format("resource unavailable: cannot open '{}/spool': {}", scratch,
                                               std::strerror(errno)));
        spool << s << "\n";
      }

      // Phase guard: where every rank is.
      hb->set(s, "phase");
      auto phases = gather_phases(comm, phase, s);
      emit(s, "phase-guard", localize_by_majority(phases), phases[size_t(r)]);

      // Scrub of the newest checkpoint against its manifest.
      std::string scrub = last_saved >= 0 ? checkpoint_problem(fmt::format("{}/ckpt/step_{:08d}", mine, last_saved)) : "";

      // This rank's share.
      const State before = st;
      hb->set(s, "compute");
      auto t0 = Clock::now();
      const int64_t pos = loader.take();
      std::vector<float> g = share_grad(st.w, pos, r, n);
      if (delay_ms) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      for (int i = 0; stall && i < 120; ++i) std::this_thread::sleep_for(std::chrono::seconds(1));  // the driver ends us
      if (stall) std::_Exit(5);
      const double compute_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();

      // The gradient exchange: checksummed messages to and from every peer; summed in rank order.
      hb->set(s, "exchange");
      std::vector<float> sum(kDim, 0.f);
      auto exchange = [&](uint64_t seq) {
        Tensor out = Tensor::empty({kWords}, DType::i64);
        int64_t* o = out.data<int64_t>();
        o[0] = int64_t(seq);
        o[1] = crc32c(g.data(), kDim * 4);
        std::memcpy(o + 2, g.data(), kDim * 4);
        std::vector<Tensor> in(static_cast<size_t>(n));
        std::vector<comm::WorkPtr> recvs(static_cast<size_t>(n)), sends;
        for (int p = 0; p < n; ++p) {
          if (p == r) continue;
          in[size_t(p)] = Tensor::zeros({kWords}, DType::i64);
          recvs[size_t(p)] = comm.recv_async(in[size_t(p)], p, 7);
          sends.push_back(comm.send_async(out, p, 7));
        }
        std::vector<int> accused;
        std::fill(sum.begin(), sum.end(), 0.f);
        for (int p = 0; p < n; ++p) {
          const float* part = g.data();
          if (p != r) {
            hb->set(s, "wait:" + std::to_string(p));  // the observer sees whom we wait on, before any timeout
            try {
              recvs[size_t(p)]->wait();
            } catch (const std::exception& e) {
              throw PeerFailure(p, e.what());
            }
            const int64_t* m = in[size_t(p)].data<int64_t>();
            part = reinterpret_cast<const float*>(m + 2);
            if (m[0] != int64_t(seq) || uint32_t(m[1]) != crc32c(part, kDim * 4)) accused.push_back(p);
          }
          for (int d = 0; d < kDim; ++d) sum[size_t(d)] += part[d];
        }
        hb->set(s, "exchange");
        for (auto& w : sends) w->wait();
        return accused;
      };
      // One all-gather per step carries every rank's accusations and its scrub's verdict.
      constexpr int kScrubBit = 62;
      auto gather_health = [&](const std::vector<int>& mine_acc, std::vector<int>& scrub_bad) {
        Tensor a = Tensor::zeros({1}, DType::i64), all = Tensor::empty({n}, DType::i64);
        for (int p : mine_acc) a.data<int64_t>()[0] |= int64_t(1) << p;
        if (!scrub.empty()) a.data<int64_t>()[0] |= int64_t(1) << kScrubBit;
        comm.all_gather(a, all);
        std::vector<std::vector<int>> acc(static_cast<size_t>(n));
        for (int q = 0; q < n; ++q) {
          const int64_t x = all.data<int64_t>()[q];
          for (int p = 0; p < n; ++p)
            if (x >> p & 1) acc[size_t(q)].push_back(p);
          if (x >> kScrubBit & 1) scrub_bad.push_back(q);
        }
        return acc;
      };
      std::vector<int> scrub_bad;
      auto acc = gather_health(exchange(uint64_t(s) * 2), scrub_bad);
      Localization by_crc = localize_by_accusations(acc);
      bool any_acc = false;
      for (auto& a : acc) any_acc = any_acc || !a.empty();
      if (any_acc) {
        emit(s, "checksums", by_crc, "a gradient message failed its CRC-32C");
        exchange(uint64_t(s) * 2 + 1);  // sent again (the corruption was on the wire, not in the data)
      }
      if (!scrub_bad.empty())
        emit(s, "checkpoint", evidence(scrub_bad),
             scrub.empty() ? "the scrub failed on rank(s) " + ranks_str(scrub_bad) : scrub);

      // SCOUT's cross-replay: every share recomputed from the state the step started from.
      hb->set(s, "replay");
      ShareRun own{buffer_hash(g.data(), kDim * 4), compute_ms};
      ReplayFinding rf = cross_replay(comm, own, [&](int q) {
        auto gq = share_grad(st.w, s, q, n);
        return ShareRun{buffer_hash(gq.data(), kDim * 4), 0.1};
      });
      Localization by_replay;
      if (!rf.sdc.empty()) {
        by_replay.verdict = Localization::outlier;
        by_replay.ranks = rf.sdc;
        std::sort(by_replay.ranks.begin(), by_replay.ranks.end());
      } else if (!rf.inconclusive.empty()) {
        by_replay.verdict = Localization::inconclusive;
      }
      emit(s, "replay", by_replay, rf.message);
      if (by_replay.verdict != Localization::clean) loader.realign(s + 1);  // the loaders back at the step's position

      // SCOUT's signatures.
      hb->set(s, "signatures");
      StepSignature sig;
      sig.step = s;
      sig.compute_ms = compute_ms;
      double norm = 0;
      for (float x : sum) norm += double(x) * x;
      sig.grad_norm = std::sqrt(norm);
      sig.grad_hash = buffer_hash(sum.data(), kDim * 4);
      sig.param_hash = before.hash();
      sig.fingerprint = comm.issued;
      Consensus cs = find_outliers(exchange_signatures(comm, sig));
      Localization by_sig;
      by_sig.verdict = cs.verdict == Consensus::clean     ? Localization::clean
                       : cs.verdict == Consensus::outlier ? Localization::outlier
                                                           : Localization::inconclusive;
      by_sig.ranks = cs.ranks;
      emit(s, "signatures", by_sig, cs.message);
      bool rollback = false;
      if (cs.verdict != Consensus::clean && cs.field != "compute time") {
        if (cs.verdict == Consensus::outlier) {  // the majority's state, broadcast from its first rank
          int root = 0;
          while (std::count(cs.ranks.begin(), cs.ranks.end(), root)) ++root;
          Tensor t = Tensor::empty({2 * kDim + 1}, DType::f32);
          float* p = t.data<float>();
          std::memcpy(p, st.w.data(), kDim * 4);
          std::memcpy(p + kDim, st.v.data(), kDim * 4);
          p[2 * kDim] = st.lr;
          comm.broadcast(t, root);
          std::memcpy(st.w.data(), p, kDim * 4);
          std::memcpy(st.v.data(), p + kDim, kDim * 4);
          st.lr = p[2 * kDim];
        } else {
          rollback = true;  // nobody can tell which copy is right: back to the last checkpoint, all of us
        }
      }
      if (rollback) {
        ATOLL_CHECK(last_saved >= 0, "step {}: the replicas disagree with no majority and there is no checkpoint", s);
        load(last_saved);
        std::printf("rolled back to step %lld\n", static_cast<long long>(last_saved));
        history.clear();
        s = last_saved;
        loader.realign(s + 1);
        continue;
      }

      // The update.
      history.push_back(before);
      if (history.size() > 3) history.pop_front();
      for (int d = 0; d < kDim; ++d) {
        st.v[size_t(d)] = 0.9f * st.v[size_t(d)] + sum[size_t(d)];
        st.w[size_t(d)] -= st.lr * st.v[size_t(d)];
      }

      // The checkpoint (and then every rank's word on its write), or a checkpoint written again
      // by every rank because a scrub failed somewhere, so that all hold a good one of this step.
      hb->set(s, "checkpoint");
      if (s % c.checkpoint_every == 0) {
        std::string write_error;
        rlimit old{};
        ::getrlimit(RLIMIT_FSIZE, &old);
        if (io_error) {
          rlimit tiny = old;
          tiny.rlim_cur = 16;
          ::setrlimit(RLIMIT_FSIZE, &tiny);
        }
        try {
          save(s);
          last_saved = s;
        } catch (const std::exception& e) {
          write_error = e.what();
        }
        ::setrlimit(RLIMIT_FSIZE, &old);
        Tensor h = Tensor::zeros({1}, DType::i64), all = Tensor::empty({n}, DType::i64);
        h.data<int64_t>()[0] = write_error.empty() ? 0 : 1;
        comm.all_gather(h, all);
        std::vector<int> bad;
        for (int q = 0; q < n; ++q)
          if (all.data<int64_t>()[q]) bad.push_back(q);
        if (!bad.empty()) {
          emit(s, "checkpoint", evidence(bad),
               write_error.empty() ? "the checkpoint write failed on rank(s) " + ranks_str(bad) : write_error);
          save(s);
          last_saved = s;
        }
      } else if (!scrub_bad.empty()) {
        save(s);
        last_saved = s;
      }
    }
    hb->set(s, "done");
    comm.barrier();
    std::printf("done %lld %016llx\n", static_cast<long long>(c.steps), static_cast<unsigned long long>(st.hash()));
    std::fflush(stdout);
    std::_Exit(0);
  } catch (const PeerFailure& e) {
    std::printf("failed %lld at %lld waiting on rank %d: %s\n", static_cast<long long>(s),
                static_cast<long long>(wall_ms()), e.peer, e.what());
    std::fflush(stdout);
    if (hb) hb->set(s, "failed:" + std::to_string(e.peer));
  } catch (const Error& e) {
    std::printf("failed %lld: %s\n", static_cast<long long>(s), e.what());
    std::fflush(stdout);
    if (hb) hb->set(s, "failed:-");
  } catch (const std::exception& e) {  // the rank's own failure: it ends the process
    std::printf("exit %lld: %s\n", static_cast<long long>(s), e.what());
    std::fflush(stdout);
    std::_Exit(3);
  }
  // A communicator failure: stay, so that the observer sees who waited on whom; the driver ends us.
  std::this_thread::sleep_for(std::chrono::seconds(120));
  std::_Exit(4);
}

}  // namespace atl::resilience::test
