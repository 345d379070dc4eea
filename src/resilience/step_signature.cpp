#include "resilience/step_signature.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

#include "core/log.h"

namespace atl::resilience {

uint64_t buffer_hash(const void* data, size_t n) {
  auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = 0x243f6a8885a308d3ull ^ n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h ^ (h >> 32);
}

static std::string ranks_str(const std::vector<int>& r) {
  std::string s;
  for (int x : r) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

Consensus find_outliers(const std::vector<StepSignature>& sigs, const ConsensusOptions& o) {
  Consensus c;
  const size_t n = sigs.size();
  if (n < 2) return c;
  auto bits = [](double d) {
    uint64_t b;
    std::memcpy(&b, &d, 8);
    return b;
  };
  struct Field {
    const char* name;
    std::function<uint64_t(const StepSignature&)> value;
  };
  const Field exact[] = {
      {"collective fingerprint", [](const StepSignature& s) { return s.fingerprint; }},
      {"step", [](const StepSignature& s) { return uint64_t(s.step); }},
      {"parameter hash", [](const StepSignature& s) { return s.param_hash; }},
      {"gradient hash", [](const StepSignature& s) { return s.grad_hash; }},
      {"gradient norm", [&](const StepSignature& s) { return bits(s.grad_norm); }},
      {"loss", [&](const StepSignature& s) { return bits(s.loss); }},
  };
  for (auto& f : exact) {
    std::map<uint64_t, std::vector<int>> groups;
    for (size_t r = 0; r < n; ++r) groups[f.value(sigs[r])].push_back(int(r));
    if (groups.size() == 1) continue;
    c.field = f.name;
    const std::vector<int>* major = nullptr;
    for (auto& [v, rs] : groups)
      if (2 * rs.size() > n) major = &rs;
    if (!major) {
      c.verdict = Consensus::inconclusive;
      c.message = fmt::format("step {}: the ranks disagree on the {} with no strict majority ({} groups over {} ranks): "
                              "inconclusive, no rank named",
                              sigs[0].step, f.name, groups.size(), n);
      return c;
    }
    for (size_t r = 0; r < n; ++r)
      if (!std::count(major->begin(), major->end(), int(r))) c.ranks.push_back(int(r));
    c.verdict = Consensus::outlier;
    c.message = fmt::format("step {}: rank {} differ{} from the strict majority ({} of {}) on the {}", sigs[0].step,
                            ranks_str(c.ranks), c.ranks.size() == 1 ? "s" : "", major->size(), n, f.name);
    return c;
  }
  // Compute time: each rank against the median of the others.
  std::vector<int> slow;
  for (size_t r = 0; r < n; ++r) {
    std::vector<double> others;
    for (size_t k = 0; k < n; ++k)
      if (k != r) others.push_back(sigs[k].compute_ms);
    std::nth_element(others.begin(), others.begin() + others.size() / 2, others.end());
    double med = others[others.size() / 2];
    if (sigs[r].compute_ms > o.time_factor * med && sigs[r].compute_ms > med + o.min_delta_ms) slow.push_back(int(r));
  }
  if (slow.empty()) return c;
  c.field = "compute time";
  if (2 * (n - slow.size()) <= n) {
    c.verdict = Consensus::inconclusive;
    c.message = fmt::format("step {}: compute times disagree with no strict majority of ranks that agree: inconclusive",
                            sigs[0].step);
    return c;
  }
  c.verdict = Consensus::outlier;
  c.ranks = slow;
  std::string times;
  for (int r : slow) times += fmt::format("{}{:.0f} ms", times.empty() ? "" : ", ", sigs[size_t(r)].compute_ms);
  c.message = fmt::format("step {}: rank {} straggle{} ({}) against a strict majority of {} of {}", sigs[0].step,
                          ranks_str(slow), slow.size() == 1 ? "s" : "", times, n - slow.size(), n);
  return c;
}

std::vector<StepSignature> exchange_signatures(comm::Communicator& comm, const StepSignature& mine) {
  const int n = comm.size();
  constexpr int kWords = 7;
  Tensor t = Tensor::empty({kWords}, DType::i64), all = Tensor::empty({kWords * int64_t(n)}, DType::i64);
  int64_t* p = t.data<int64_t>();
  p[0] = mine.step;
  std::memcpy(p + 1, &mine.compute_ms, 8);
  std::memcpy(p + 2, &mine.loss, 8);
  std::memcpy(p + 3, &mine.grad_norm, 8);
  std::memcpy(p + 4, &mine.grad_hash, 8);
  std::memcpy(p + 5, &mine.fingerprint, 8);
  std::memcpy(p + 6, &mine.param_hash, 8);
  comm.all_gather(t, all);
  std::vector<StepSignature> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int64_t* q = all.data<int64_t>() + kWords * r;
    StepSignature& s = out[size_t(r)];
    s.step = q[0];
    std::memcpy(&s.compute_ms, q + 1, 8);
    std::memcpy(&s.loss, q + 2, 8);
    std::memcpy(&s.grad_norm, q + 3, 8);
    std::memcpy(&s.grad_hash, q + 4, 8);
    std::memcpy(&s.fingerprint, q + 5, 8);
    std::memcpy(&s.param_hash, q + 6, 8);
  }
  return out;
}

}  // namespace atl::resilience
