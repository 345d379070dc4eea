#include "resilience/phase_guard.h"

#include <cstring>
#include <map>
#include <vector>

#include "core/log.h"
#include "resilience/invariant_gate.h"

namespace atl::resilience {

namespace {
struct Gathered {
  std::map<std::pair<int64_t, int64_t>, std::vector<int>> where;  // (phase hash, step) -> ranks
  std::map<int64_t, std::string> names;
  std::vector<std::string> per_rank;
};

Gathered gather(comm::Communicator& comm, const std::string& phase, int64_t step) {
  const int n = comm.size();
  // The phase by name: 8 bytes of it, zero-padded, then a hash of the rest (names are short).
  Tensor mine = Tensor::zeros({3}, DType::i64), all = Tensor::empty({3 * int64_t(n)}, DType::i64);
  std::memcpy(mine.raw(), phase.data(), std::min<size_t>(8, phase.size()));
  mine.data<int64_t>()[1] = int64_t(std::stoull(hash_hex(phase), nullptr, 16) >> 1);
  mine.data<int64_t>()[2] = step;
  comm.all_gather(mine, all);
  Gathered g;
  for (int r = 0; r < n; ++r) {
    const int64_t* p = all.data<int64_t>() + 3 * r;
    g.where[{p[1], p[2]}].push_back(r);
    char buf[9] = {};
    std::memcpy(buf, p, 8);
    g.names[p[1]] = buf;
    g.per_rank.push_back(fmt::format("{}#{:x}@{}", buf, p[1], p[2]));
  }
  return g;
}
}  // namespace

std::vector<std::string> gather_phases(comm::Communicator& comm, const std::string& phase, int64_t step) {
  if (comm.size() <= 1) return {phase + "@" + std::to_string(step)};
  return gather(comm, phase, step).per_rank;
}

void check_phase(comm::Communicator& comm, const std::string& phase, int64_t step) {
  if (comm.size() <= 1) return;
  Gathered g = gather(comm, phase, step);
  auto& where = g.where;
  auto& names = g.names;
  if (where.size() == 1) return;
  std::string s;
  for (auto& [k, ranks] : where) {
    std::string rl;
    for (int r : ranks) rl += (rl.empty() ? "" : ", ") + std::to_string(r);
    s += fmt::format("{}rank{} {} at '{}' of step {}", s.empty() ? "" : "; ", ranks.size() > 1 ? "s" : "", rl,
                     names[k.first], k.second);
  }
  fail("collective desync caught at a phase boundary: {} (an evaluation, sample or checkpoint that only some ranks "
       "ran would have hung the next collective)",
       s);
}

}  // namespace atl::resilience
