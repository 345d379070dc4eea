#include "resilience/invariant_gate.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "core/log.h"

namespace atl::resilience {

std::string hash_hex(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

static std::string rank_list(const std::vector<int>& r) {
  std::string s = r.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < r.size(); ++i) s += (i ? ", " : "") + std::to_string(r[i]);
  return s;
}

// Groups the ranks by value; a sentence when there is more than one group, the largest (the
// job's majority, ties to the one with rank 0) first, so the odd ranks come out named.
template <typename F>
static void same(const std::vector<RunFacts>& all, const char* what, F value, std::vector<std::string>& out) {
  std::map<std::string, std::vector<int>> groups;
  for (size_t r = 0; r < all.size(); ++r) groups[value(all[r])].push_back(int(r));
  if (groups.size() < 2) return;
  std::vector<std::pair<std::string, std::vector<int>>> g(groups.begin(), groups.end());
  std::stable_sort(g.begin(), g.end(), [](auto& a, auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() > b.second.size();
    return a.second.front() < b.second.front();
  });
  std::string s = fmt::format("ranks disagree on the {}:", what);
  for (size_t i = g.size(); i-- > 0;)  // minorities first: they are the likely culprits
    s += fmt::format(" {} {} '{}'{}", rank_list(g[i].second), g[i].second.size() == 1 ? "has" : "have", g[i].first,
                     i ? ";" : "");
  out.push_back(s);
}

std::vector<std::string> compare_run_facts(const std::vector<RunFacts>& all) {
  std::vector<std::string> out;
  same(all, "config hash", [](const RunFacts& f) { return f.config_hash; }, out);
  same(all, "parameter hash", [](const RunFacts& f) { return f.param_hash; }, out);
  same(all, "parameter count", [](const RunFacts& f) { return std::to_string(f.param_count); }, out);
  same(all, "dtype", [](const RunFacts& f) { return f.dtype; }, out);
  same(all, "world layout", [](const RunFacts& f) { return f.layout; }, out);
  same(all, "data index space", [](const RunFacts& f) { return f.data_space; }, out);
  size_t before = out.size();
  same(all, "per-rank batch count for the epoch", [](const RunFacts& f) { return std::to_string(f.batches_per_epoch); },
       out);
  if (out.size() > before)
    out.back() += " (uneven data: the ranks with fewer batches would leave the others waiting in a collective)";
  for (size_t a = 0; a < all.size(); ++a)
    for (size_t b = a + 1; b < all.size(); ++b)
      for (auto& [ab, ae] : all[a].shards)
        for (auto& [bb, be] : all[b].shards)
          if (ab < be && bb < ae) {
            out.push_back(fmt::format("data shards overlap: rank {} reads [{}, {}) and rank {} reads [{}, {}) of {}", a, ab,
                                      ae, b, bb, be, all[a].data_space));
            goto next_pair;
          }
next_pair:;
  return out;
}

static nlohmann::json to_json(const RunFacts& f) {
  return {{"config_hash", f.config_hash}, {"param_hash", f.param_hash}, {"param_count", f.param_count},
          {"dtype", f.dtype},             {"layout", f.layout},         {"data_space", f.data_space},
          {"shards", f.shards},           {"batches", f.batches_per_epoch}};
}

static RunFacts from_json(const nlohmann::json& j) {
  RunFacts f;
  f.config_hash = j.at("config_hash");
  f.param_hash = j.at("param_hash");
  f.param_count = j.at("param_count");
  f.dtype = j.at("dtype");
  f.layout = j.at("layout");
  f.data_space = j.at("data_space");
  f.shards = j.at("shards").get<std::vector<std::pair<int64_t, int64_t>>>();
  f.batches_per_epoch = j.at("batches");
  return f;
}

void check_run_invariants(comm::Communicator& comm, const RunFacts& mine, std::chrono::milliseconds timeout) {
  const auto saved = comm.timeout();
  comm.set_timeout(std::min(saved, timeout));
  std::vector<RunFacts> all;
  try {
    std::string blob = to_json(mine).dump();
    const int n = comm.size();
    Tensor len = Tensor::empty({1}, DType::i64), lens = Tensor::empty({n}, DType::i64);
    len.data<int64_t>()[0] = int64_t(blob.size());
    comm.all_gather(len, lens);
    int64_t longest = 0;
    for (int r = 0; r < n; ++r) longest = std::max(longest, lens.data<int64_t>()[r]);
    const int64_t words = (longest + 7) / 8;
    Tensor mine_t = Tensor::zeros({words}, DType::i64), every = Tensor::empty({words * n}, DType::i64);
    std::memcpy(mine_t.raw(), blob.data(), blob.size());
    comm.all_gather(mine_t, every);
    for (int r = 0; r < n; ++r) {
      std::string s(static_cast<const char*>(every.raw()) + size_t(r * words * 8), size_t(lens.data<int64_t>()[r]));
      all.push_back(from_json(nlohmann::json::parse(s)));
    }
  } catch (...) {
    comm.set_timeout(saved);
    throw;
  }
  comm.set_timeout(saved);
  auto problems = compare_run_facts(all);
  if (problems.empty()) return;
  std::string msg = fmt::format("pre-run gate: this launch is refused before step 1 ({} problem{}):", problems.size(),
                                problems.size() == 1 ? "" : "s");
  for (auto& p : problems) msg += "\n  - " + p;
  fail("{}", msg);
}

}  // namespace atl::resilience
