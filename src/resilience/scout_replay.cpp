#include "resilience/scout_replay.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "core/log.h"

namespace atl::resilience {

namespace fs = std::filesystem;

namespace {
struct Computation {
  int by = 0;
  uint64_t hash = 0;
  double ms = 0;
};
int64_t bits(double d) {
  int64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}
double unbits(int64_t b) {
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}
std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += fmt::format("{}{}", s.empty() ? "" : ", ", x);
  return s;
}
void add_unique(std::vector<int>& v, int x) {
  if (!std::count(v.begin(), v.end(), x)) v.push_back(x);
}
}  // namespace

ReplayFinding judge_replays(const std::vector<std::vector<int64_t>>& rows, int witnesses, const ReplayOptions& o) {
  const int n = int(rows.size());
  std::vector<std::vector<Computation>> share(static_cast<size_t>(n));  // [0] is the owner's
  for (int r = 0; r < n; ++r) {
    const auto& q = rows[size_t(r)];
    share[size_t(r)].insert(share[size_t(r)].begin(), Computation{r, uint64_t(q[0]), unbits(q[1])});
    for (int k = 0; k < witnesses; ++k) {
      int j = int(q[size_t(3 + 3 * k)]);
      if (j < 0 || j >= n) continue;
      share[size_t(j)].push_back(Computation{r, uint64_t(q[size_t(4 + 3 * k)]), unbits(q[size_t(5 + 3 * k)])});
    }
  }
  // (each list starts with the owner's computation: it is inserted at the front)
  ReplayFinding f;
  std::vector<double> all_ms;
  for (auto& s : share)
    for (auto& c : s) all_ms.push_back(c.ms);
  std::sort(all_ms.begin(), all_ms.end());
  const double median = all_ms.empty() ? 0 : all_ms[all_ms.size() / 2];
  std::vector<std::string> why;
  for (int j = 0; j < n; ++j) {
    const auto& s = share[size_t(j)];
    std::map<uint64_t, int> votes;
    for (auto& c : s) ++votes[c.hash];
    if (votes.size() > 1) {
      auto best = std::max_element(votes.begin(), votes.end(), [](auto& a, auto& b) { return a.second < b.second; });
      if (2 * best->second > int(s.size())) {
        for (auto& c : s)
          if (c.hash != best->first) {
            add_unique(f.sdc, c.by);
            if (c.by == j) f.corrupt_shares.push_back(j);
            why.push_back(fmt::format("rank {}'s {} of share {} differs from {} of {} computations", c.by,
                                      c.by == j ? "own computation" : "replay", j, best->second, s.size()));
          }
      } else {
        f.inconclusive.push_back(j);
        why.push_back(fmt::format("share {}'s {} computations disagree without a strict majority", j, s.size()));
      }
    }
    if (s.size() < 2) continue;
    double fastest_replay = 1e300, slowest_all = 0, fastest_all = 1e300;
    for (auto& c : s) {
      if (c.by != j) fastest_replay = std::min(fastest_replay, c.ms);
      fastest_all = std::min(fastest_all, c.ms);
      slowest_all = std::max(slowest_all, c.ms);
    }
    const double own = s[0].ms;
    if (own > o.time_factor * fastest_replay && own - fastest_replay > o.min_delta_ms) {
      f.stragglers.push_back(j);
      why.push_back(fmt::format("rank {} took {:.0f} ms for its share, {:.0f} ms when other ranks replayed it", j, own,
                                fastest_replay));
    } else if (fastest_all > o.time_factor * median && fastest_all - median > o.min_delta_ms) {
      f.slow_shares.push_back(j);
      why.push_back(fmt::format("share {} is slow wherever it is computed ({:.0f} ms at best, median {:.0f} ms): "
                                "its data, not a node",
                                j, fastest_all, median));
    }
  }
  std::sort(f.sdc.begin(), f.sdc.end());
  if (why.empty()) {
    f.message = fmt::format("replay: every share of the step reproduced on {} ranks", witnesses + 1);
  } else {
    f.message = "replay:";
    if (!f.sdc.empty()) f.message += " silent data corruption on rank(s) " + list(f.sdc) + ";";
    if (!f.stragglers.empty()) f.message += " straggler(s) confirmed: rank(s) " + list(f.stragglers) + ";";
    if (!f.slow_shares.empty()) f.message += " slow share(s) " + list(f.slow_shares) + " (data, no rank blamed);";
    if (!f.inconclusive.empty()) f.message += " inconclusive for share(s) " + list(f.inconclusive) + ";";
    for (auto& w : why) f.message += " " + w + ";";
    f.message.pop_back();
  }
  return f;
}

ReplayFinding cross_replay(comm::Communicator& comm, const ShareRun& own, const std::function<ShareRun(int)>& replay,
                           const ReplayOptions& o) {
  const int n = comm.size(), r = comm.rank();
  const int w = std::max(0, std::min(o.witnesses, n - 1));
  const int words = 3 + 3 * w;
  Tensor mine = Tensor::zeros({words}, DType::i64), all = Tensor::zeros({int64_t(words) * n}, DType::i64);
  int64_t* p = mine.data<int64_t>();
  p[0] = int64_t(own.hash);
  p[1] = bits(own.ms);
  p[2] = w;
  for (int k = 0; k < w; ++k) {
    int j = ((r - 1 - k) % n + n) % n;  // the ranks before this one
    ShareRun s = replay(j);
    p[3 + 3 * k] = j;
    p[4 + 3 * k] = int64_t(s.hash);
    p[5 + 3 * k] = bits(s.ms);
  }
  comm.all_gather(mine, all);
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) rows[size_t(q)].assign(all.data<int64_t>() + words * q, all.data<int64_t>() + words * (q + 1));
  return judge_replays(rows, w, o);
}

nlohmann::json ReplayCertificate::to_json() const {
  return {{"step", step}, {"since", since}, {"audited", audited}, {"corrupt", corrupt}, {"clean", clean},
          {"finding", finding}};
}

ReplayCertificate ReplayCertificate::from_json(const nlohmann::json& j) {
  ReplayCertificate c;
  c.step = j.at("step").get<int64_t>();
  c.since = j.at("since").get<int64_t>();
  c.audited = j.at("audited").get<int64_t>();
  c.corrupt = j.at("corrupt").get<int64_t>();
  c.clean = j.at("clean").get<bool>();
  c.finding = j.value("finding", "");
  return c;
}

void CertificateChain::resume(int64_t step, bool clean) {
  prev_clean_ = clean;
  since_ = step;
  audited_ = corrupt_ = 0;
  finding_.clear();
}

void CertificateChain::audited(int64_t step, const ReplayFinding& f) {
  ++audited_;
  if (!f.corrupt_shares.empty() || !f.inconclusive.empty()) {
    if (corrupt_++ == 0) finding_ = fmt::format("step {}: {}", step, f.message);
  }
}

ReplayCertificate CertificateChain::certify(int64_t step) {
  ReplayCertificate c;
  c.step = step;
  c.since = since_;
  c.audited = audited_;
  c.corrupt = corrupt_;
  c.finding = prev_clean_ ? finding_ : "descends from an uncertified or corrupted state";
  c.clean = prev_clean_ && corrupt_ == 0 && audited_ == step - since_;
  prev_clean_ = c.clean;
  since_ = step;
  audited_ = corrupt_ = 0;
  finding_.clear();
  return c;
}

ResumeChoice choose_certified_checkpoint(const std::string& dir) {
  ResumeChoice r;
  auto all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    std::string name = fs::path(it->path).filename().string();
    std::string why = checkpoint_problem(it->path);
    if (why.empty()) {
      try {
        std::ifstream f((fs::path(it->path) / "state.json").string());
        std::stringstream ss;
        ss << f.rdbuf();
        auto st = nlohmann::json::parse(ss.str());
        if (!st.contains("replay_certificate")) {
          why = "no clean-replay certificate";
        } else {
          auto c = ReplayCertificate::from_json(st["replay_certificate"]);
          if (!c.clean)
            why = c.corrupt > 0 ? fmt::format("its replay certificate is not clean: {}", c.finding)
                  : c.audited < c.step - c.since
                      ? fmt::format("only {} of steps {}..{} were replayed", c.audited, c.since + 1, c.step)
                      : fmt::format("its replay certificate is not clean: {}", c.finding);
        }
      } catch (const std::exception& e) {
        why = fmt::format("its replay certificate cannot be read: {}", e.what());
      }
    }
    if (why.empty()) {
      r.chosen = *it;
      break;
    }
    r.rejected.push_back(name + ": " + why);
  }
  return r;
}

}  // namespace atl::resilience
