#include "dp_toy.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "core/log.h"
#include "proc.h"
#include "resilience/deadpool.h"
#include "resilience/quorum.h"

namespace atl::resilience::test {

namespace {

constexpr int kDim = 32, kRows = 12;
constexpr double kFix = 1073741824.0;  // 2^30

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
double unit(uint64_t h) { return double(h >> 11) / double(1ull << 53) * 2.0 - 1.0; }

struct Slot {
  double w[kDim] = {}, v[kDim] = {};
  uint64_t rng = 0;  // this slot's own
  explicit Slot(int s = 0) : rng(mix(1000 + uint64_t(s))) {}

  // Slot s's share of step `step` in fixed point: its rows' gradient plus its own noise.
  void share(int64_t step, int s, int slots, int64_t* q) const {
    double g[kDim] = {};
    for (int r = s * kRows / slots; r < (s + 1) * kRows / slots; ++r) {
      double x[kDim], pred = 0, y = 0;
      for (int d = 0; d < kDim; ++d) {
        x[d] = unit(mix(uint64_t(step) * 131071 + uint64_t(r) * 257 + uint64_t(d)));
        pred += w[d] * x[d];
        y += unit(mix(uint64_t(d) + 99991)) * x[d];
      }
      for (int d = 0; d < kDim; ++d) g[d] += (pred - y) * x[d];
    }
    for (int d = 0; d < kDim; ++d) q[d] = std::llround((g[d] + 1e-3 * unit(mix(rng + uint64_t(d)))) * kFix);
  }
  void apply(const int64_t* q) {
    for (int d = 0; d < kDim; ++d) {
      v[d] = 0.9 * v[d] + double(q[d]) / kFix / kRows;
      w[d] -= 0.05 * v[d];
    }
    advance();
  }
  void advance() { rng = mix(rng); }
  uint64_t weights_hash() const {
    uint64_t h = 7;
    for (const double* a : {w, v})
      for (int d = 0; d < kDim; ++d) {
        uint64_t b;
        std::memcpy(&b, &a[d], 8);
        h = mix(h ^ b);
      }
    return h;
  }
  uint64_t hash() const { return mix(weights_hash() ^ rng); }
};

std::string hex(uint64_t h) {
  char b[20];
  std::snprintf(b, sizeof b, "%016" PRIx64, h);
  return b;
}

}  // namespace

std::vector<std::string> dp_reference(int slots, int64_t steps) {
  std::vector<Slot> s;
  for (int i = 0; i < slots; ++i) s.emplace_back(i);
  for (int64_t step = 0; step < steps; ++step) {
    int64_t sum[kDim] = {}, q[kDim];
    for (int i = 0; i < slots; ++i) {
      s[size_t(i)].share(step, i, slots, q);
      for (int d = 0; d < kDim; ++d) sum[d] += q[d];
    }
    for (auto& x : s) x.apply(sum);
  }
  std::vector<std::string> out;
  for (auto& x : s) out.push_back(hex(x.hash()));
  return out;
}

int dp_replica_main(int argc, char** argv) {
  try {
    ATOLL_CHECK(argc >= 7, "--dp-replica ID SLOTS STEPS LIGHTHOUSE_PORT STEP_SLEEP_MS EVERY SPARE");
    QuorumOptions o = QuorumOptions::from_environment();
    int id = std::atoi(argv[0]), slots = std::atoi(argv[1]);
    int64_t steps = std::atoll(argv[2]);
    o.lighthouse_port = std::atoi(argv[3]);
    int sleep_ms = std::atoi(argv[4]), every = std::atoi(argv[5]);
    bool spare = std::atoi(argv[6]) != 0;
    o.slots = slots;
    if (spare) {
      id = wait_for_slot(o.lighthouse_host, o.lighthouse_port, id, std::chrono::minutes(5));
      if (id < 0) {
        std::printf("spare unused\n");
        return 0;
      }
    }
    o.replica_id = id;
    Slot m(id);
    ReplicaState st;
    PeerCheckpointer pc(o.lighthouse_host, o.lighthouse_port, id, slots, every);
    if (spare) {
      auto snap = pc.fetch_own(std::chrono::seconds(10));
      ATOLL_CHECK(snap && snap->blob.size() == sizeof m.w + sizeof m.v + 8,
                  "spare for slot {}: its peer holds no snapshot of it", id);
      std::memcpy(m.w, snap->blob.data(), sizeof m.w);
      std::memcpy(m.v, snap->blob.data() + sizeof m.w, sizeof m.v);
      std::memcpy(&m.rng, snap->blob.data() + sizeof m.w + sizeof m.v, 8);
      st.step = snap->step;
      std::printf("restored slot %d from the peer snapshot of step %lld at %lld\n", id,
                  static_cast<long long>(snap->step), static_cast<long long>(wall_ms()));
    }
    QuorumReplica ft(o);
    // The replicated part travels in tensors (healing broadcasts them); the RNG is the slot's own.
    Tensor wt = Tensor::empty({2 * kDim}, DType::i64);
    auto to_tensors = [&] {
      std::memcpy(wt.raw(), m.w, sizeof m.w);
      std::memcpy(static_cast<char*>(wt.raw()) + sizeof m.w, m.v, sizeof m.v);
    };
    to_tensors();
    st.tensors = {wt};
    bool healed = false;
    st.advance_own = [&](int64_t from, int64_t to) {
      for (int64_t i = from; i < to; ++i) m.advance();
      healed = true;
      std::printf("rolled own state forward from step %lld to %lld\n", static_cast<long long>(from),
                  static_cast<long long>(to));
    };
    int64_t sum[kDim];
    while (st.step < steps) {
      int64_t ran = -1;
      healed = false;
      bool ok = ft.step(
          st,
          [&](comm::Communicator& c) {
            if (healed) {
              pc.fence();  // the copy of the last snapshot reads m
              std::memcpy(m.w, wt.raw(), sizeof m.w);
              std::memcpy(m.v, static_cast<char*>(wt.raw()) + sizeof m.w, sizeof m.v);
            }
            ran = st.step + 1;
            m.share(st.step, id, slots, sum);
            std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));  // "compute"
            Tensor g = Tensor::empty({kDim}, DType::i64);
            std::memcpy(g.raw(), sum, sizeof sum);
            c.all_reduce(g);
            std::memcpy(sum, g.raw(), sizeof sum);
          },
          [&] {
            pc.fence();
            m.apply(sum);
            to_tensors();
          });
      if (ok) {
        pc.after_commit(st.step, {{m.w, sizeof m.w}, {m.v, sizeof m.v}, {&m.rng, 8}});
        std::printf("commit %lld %lld\n", static_cast<long long>(ran), static_cast<long long>(wall_ms()));
      }
      std::fflush(stdout);
    }
    pc.fence();
    ft.finish(st);
    auto ss = pc.sender().stats();
    std::printf("snapshots copied %lld sent %lld superseded %lld failures %lld fence_wait_ms %.1f\n",
                static_cast<long long>(ss.copied), static_cast<long long>(ss.sent),
                static_cast<long long>(ss.superseded), static_cast<long long>(ss.failures), ss.fence_wait_ms);
    std::printf("final %lld %s %s\n", static_cast<long long>(st.step), hex(m.hash()).c_str(),
                hex(m.weights_hash()).c_str());
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dp replica failed: %s\n", e.what());
    return 1;
  }
}

// Peer snapshots on and off, in one process against a holder on loopback: a "step" reads the
// whole state `passes` times (as forward and backward read the weights), then an "optimizer" pass
// rewrites all of it; with snapshots, fence() before the optimizer and snapshot() after it. Blocks
// of off and on steps alternate so that a change in the machine's load hits both alike.
int dp_bench_main(int argc, char** argv) {
  ATOLL_CHECK(argc >= 4, "--dp-bench STATE_MB STEPS COMPUTE_PASSES EVERY");
  size_t n = size_t(std::atoll(argv[0])) * (1u << 20) / 4;
  int steps = std::atoi(argv[1]), passes = std::atoi(argv[2]), every = std::max(1, std::atoi(argv[3]));
  // The holder is another process (another host in production), started before any thread here.
  int to_parent[2], to_child[2];
  ATOLL_CHECK(::pipe(to_parent) == 0 && ::pipe(to_child) == 0, "pipe failed");
  pid_t child = ::fork();
  ATOLL_CHECK(child >= 0, "fork failed");
  if (child == 0) {
    ::close(to_parent[0]);
    ::close(to_child[1]);
    {
      SnapshotHolder h("127.0.0.1", 0);
      int port = h.port();
      (void)!::write(to_parent[1], &port, sizeof port);
      char c;
      while (::read(to_child[0], &c, 1) > 0) {
      }  // until the parent closes the pipe (or dies)
    }
    ::_exit(0);
  }
  ::close(to_parent[1]);
  ::close(to_child[0]);
  int port = 0;
  ATOLL_CHECK(::read(to_parent[0], &port, sizeof port) == sizeof port, "the holder process did not start");
  std::vector<float> state(n, 0.5f);
  std::string addr = "127.0.0.1:" + std::to_string(port);
  auto sender = std::make_unique<SnapshotSender>(0, [&] { return addr; });
  using C = std::chrono::steady_clock;
  std::vector<double> off, on, fence;
  volatile float sink = 0;
  int64_t step = 0;
  auto block = [&](bool snap, int k) {
    for (int i = 0; i < k; ++i, ++step) {
      auto t0 = C::now();
      float acc = 0;
      for (int p = 0; p < passes; ++p)
        for (size_t j = 0; j < n; j += 4) acc += state[j] * state[j + 1] + state[j + 2] * state[j + 3];
      sink = sink + acc;
      bool take = snap && step % every == 0;
      if (snap) fence.push_back(sender->fence());
      for (size_t j = 0; j < n; ++j) state[j] = state[j] * 0.999f + 1e-4f;
      if (take) sender->snapshot(step, {{state.data(), n * 4}});
      double ms = std::chrono::duration<double, std::milli>(C::now() - t0).count();
      (snap ? on : off).push_back(ms);
    }
  };
  block(true, 2);  // warm-up: first connection, page faults of the staging buffers
  on.clear();
  fence.clear();
  for (int b = 0; b < 4; ++b) {
    block(false, steps / 8);
    block(true, steps / 8);
  }
  sender->fence();
  sender->snapshot(step, {{state.data(), n * 4}});
  sender->fence();
  bool acked = sender->wait_acked(step, std::chrono::seconds(30));
  auto med = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  auto ss = sender->stats();
  sender.reset();
  ::close(to_child[1]);
  ::waitpid(child, nullptr, 0);
  double m_off = med(off), m_on = med(on);
  std::printf("peer snapshots every %d steps, %s MB of state, %d read passes per step, %zu steps each:\n", every,
              argv[0], passes, off.size());
  std::printf("  median step: off %.2f ms, on %.2f ms (%+.1f%%); median fence wait %.3f ms\n", m_off, m_on,
              100.0 * (m_on - m_off) / m_off, med(fence));
  std::printf("  last copy %.1f ms, last send %.1f ms; copied %lld, sent %lld, superseded %lld, failures %lld; "
              "last acked %s\n",
              ss.copy_ms, ss.send_ms, static_cast<long long>(ss.copied), static_cast<long long>(ss.sent),
              static_cast<long long>(ss.superseded), static_cast<long long>(ss.failures), acked ? "yes" : "NO");
  return acked ? 0 : 1;
}

}  // namespace atl::resilience::test
