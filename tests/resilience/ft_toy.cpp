#include "ft_toy.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "core/log.h"
#include "proc.h"
#include "resilience/quorum.h"

namespace atl::resilience::test {

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
static float unit(uint64_t h) { return float(double(h >> 11) / double(1ull << 53) * 2.0 - 1.0); }

ToyModel::ToyModel() : w(kDim, 0.f), v(kDim, 0.f) {}

std::vector<float> ToyModel::grad(int64_t step, int r0, int r1) const {
  std::vector<float> g(kDim, 0.f);
  for (int r = r0; r < r1; ++r) {
    float x[kDim], pred = 0, y = 0;
    for (int d = 0; d < kDim; ++d) {
      x[d] = unit(mix(uint64_t(step) * 131071 + uint64_t(r) * 257 + uint64_t(d)));
      pred += w[size_t(d)] * x[d];
      y += unit(mix(uint64_t(d) + 99991)) * x[d];  // the true weights
    }
    float e = pred - y;
    for (int d = 0; d < kDim; ++d) g[size_t(d)] += e * x[d] / float(kG);
  }
  return g;
}

void ToyModel::apply(const std::vector<float>& g) {
  rng = mix(rng);
  for (int d = 0; d < kDim; ++d) {
    v[size_t(d)] = 0.9f * v[size_t(d)] + g[size_t(d)];
    w[size_t(d)] -= 0.05f * v[size_t(d)] + 1e-4f * unit(mix(rng + uint64_t(d)));
  }
}

uint64_t ToyModel::hash() const {
  uint64_t h = rng;
  for (const auto* vec : {&w, &v})
    for (float f : *vec) {
      uint32_t b;
      std::memcpy(&b, &f, 4);
      h = mix(h ^ b);
    }
  return h;
}

ToyModel train_single(int64_t steps) {
  ToyModel m;
  for (int64_t s = 0; s < steps; ++s) m.apply(m.grad(s, 0, kG));
  return m;
}

int replica_main(int argc, char** argv) {
  try {
    ATOLL_CHECK(argc >= 5, "--ft-replica ID STEPS LIGHTHOUSE_PORT STEP_SLEEP_MS OUT");
    QuorumOptions o = QuorumOptions::from_environment();
    o.replica_id = std::atoi(argv[0]);
    int64_t steps = std::atoll(argv[1]);
    o.lighthouse_port = std::atoi(argv[2]);
    int sleep_ms = std::atoi(argv[3]);
    std::string out = argv[4];
    QuorumReplica ft(o);
    ToyModel m;
    // The replica's state lives in tensors so that healing can broadcast it in place.
    Tensor w = Tensor::empty({kDim}, DType::f32), v = Tensor::empty({kDim}, DType::f32);
    ReplicaState st;
    st.tensors = {w, v};
    st.save_extra = [&] { return std::to_string(m.rng); };
    st.load_extra = [&](const std::string& s) { m.rng = std::strtoull(s.c_str(), nullptr, 10); };
    auto to_tensors = [&] {
      std::memcpy(w.raw(), m.w.data(), kDim * 4);
      std::memcpy(v.raw(), m.v.data(), kDim * 4);
    };
    auto from_tensors = [&] {
      std::memcpy(m.w.data(), w.raw(), kDim * 4);
      std::memcpy(m.v.data(), v.raw(), kDim * 4);
    };
    to_tensors();
    std::vector<float> g;
    while (st.step < steps) {
      int64_t ran = -1;
      bool ok = ft.step(
          st,
          [&](comm::Communicator& c) {
            from_tensors();  // after a heal
            ran = st.step + 1;
            int n = c.size(), k = c.rank();
            g = m.grad(st.step, k * kG / n, (k + 1) * kG / n);
            std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));  // "compute"
            Tensor gt = Tensor::empty({kDim}, DType::f32);
            std::memcpy(gt.raw(), g.data(), kDim * 4);
            c.all_reduce(gt);
            std::memcpy(g.data(), gt.raw(), kDim * 4);
          },
          [&] {
            m.apply(g);
            to_tensors();
          });
      if (ok) std::printf("commit %lld %lld\n", static_cast<long long>(ran), static_cast<long long>(wall_ms()));
      std::fflush(stdout);
    }
    ft.finish(st);
    from_tensors();
    std::printf("final %lld %016" PRIx64 " heals %lld discarded %lld\n", static_cast<long long>(st.step), m.hash(),
                static_cast<long long>(ft.stats().heals), static_cast<long long>(ft.stats().discarded));
    std::fflush(stdout);
    std::ofstream f(out, std::ios::binary);
    f.write(reinterpret_cast<const char*>(m.w.data()), kDim * 4);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "replica failed: %s\n", e.what());
    return 1;
  }
}

}  // namespace atl::resilience::test
