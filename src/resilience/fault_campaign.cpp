#include "resilience/fault_campaign.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/log.h"

namespace atl::resilience {

const std::vector<FaultType>& fault_catalog() {
  static const std::vector<FaultType> c = {
      {"tensor_corruption", "numeric/state", "flips one bit of one weight in the rank's live parameters",
       "signatures (parameter hash) and replay", true, false},
      {"stale_state", "numeric/state", "puts back the rank's weights and momentum of 3 steps earlier",
       "signatures (parameter hash) and replay", true, false},
      {"drop", "numeric/state", "the rank's data loader skips one batch", "replay (share hash)", true, false},
      {"duplicate", "numeric/state", "the rank's data loader serves the previous batch again", "replay (share hash)",
       true, false},
      {"reorder", "numeric/state", "the rank's data loader swaps its next two batches", "replay (share hash)", true,
       false},
      {"config_drift", "numeric/state", "the rank's learning rate changes (x1.5), as a re-read config would",
       "signatures (parameter hash, which covers the hyperparameters)", true, false},
      {"delay", "performance/liveness", "the rank sleeps 800 ms inside its compute", "signatures (compute time)", true,
       false},
      {"hang", "performance/liveness", "SIGSTOP to the rank's own process (every thread frozen)",
       "lighthouse observer (heartbeats stopped, connection open)", false, true},
      {"timeout", "performance/liveness",
       "the rank stays in its compute past the communicator timeout (its heartbeat goes on)",
       "communicator timeouts (who waited on whom)", true, true},
      {"exception", "runtime", "an exception thrown from the rank's step ends its process", "exit status", false,
       true},
      {"resource_exhaustion", "runtime", "the rank's address space is capped (RLIMIT_AS) and it allocates until "
       "std::bad_alloc", "exit status", false, true},
      {"process_termination", "runtime", "SIGKILL to the rank's own process", "exit status", false, true},
      {"resource_unavailable", "runtime",
       "the rank's node-local scratch directory is replaced by a file: its next spool write fails (ENOTDIR)",
       "exit status", false, true},
      {"checkpoint_corruption", "checkpoint/storage", "flips one byte of the rank's newest checkpoint's model file",
       "checkpoint manifest (CRC-32C) scrub", false, false},
      {"checkpoint_truncation", "checkpoint/storage", "truncates that file to half its size",
       "checkpoint manifest (size) scrub", false, false},
      {"checkpoint_missing", "checkpoint/storage", "deletes the rank's newest checkpoint directory",
       "checkpoint scrub", false, false},
      {"checkpoint_io_error", "checkpoint/storage",
       "caps the rank's file size (RLIMIT_FSIZE) during its checkpoint write: write() fails with EFBIG",
       "checkpoint write error", false, false},
      {"payload_corruption", "communication",
       "the communicator's fault hook flips one bit of the rank's gradient message after its checksum",
       "receivers' CRC-32C (accusations)", true, false},
      {"collective_desync", "communication", "the rank enters an 'eval' phase boundary while the others enter 'step'",
       "phase guard (fingerprint all-gather)", true, false},
      {"message_drop", "communication", "the communicator's fault hook swallows the rank's gradient messages of one "
       "exchange", "receivers' timeouts (accusations)", true, true},
      {"network_partition", "communication",
       "the communicator's fault hook drops every message to and from the rank from then on (at the communicator: "
       "no network namespace in the test)",
       "receivers' timeouts (accusations)", true, true},
  };
  return c;
}

const FaultType& fault_type(const std::string& name) {
  for (auto& t : fault_catalog())
    if (name == t.name) return t;
  std::string known;
  for (auto& t : fault_catalog()) known += (known.empty() ? "" : ", ") + std::string(t.name);
  fail("unknown fault type '{}' (known: {})", name, known);
}

const char* verdict_name(Localization::Verdict v) {
  return v == Localization::clean ? "clean" : v == Localization::outlier ? "outlier" : "inconclusive";
}

namespace {
uint64_t splitmix(uint64_t& s) {
  uint64_t x = (s += 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

Campaign parse_campaign(const std::string& text, int world, const std::string& where) {
  ATOLL_CHECK(world >= 2, "{}: a campaign needs at least 2 ranks, got {}", where, world);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("{}: not valid JSON: {}", where, e.what());
  }
  ATOLL_CHECK(j.is_object(), "{}: the campaign must be a JSON object", where);
  static const std::set<std::string> keys = {"seed", "first_step", "spacing", "checkpoint_every", "tail", "steps", "faults"};
  for (auto& [k, v] : j.items())
    ATOLL_CHECK(keys.count(k), "{}: unknown key '{}' (known: seed, first_step, spacing, checkpoint_every, tail, steps, faults)",
                where, k);
  auto integer = [&](const char* k, int64_t dflt, int64_t lo) {
    if (!j.contains(k)) return dflt;
    ATOLL_CHECK(j[k].is_number_integer() && j[k].get<int64_t>() >= lo, "{}: '{}' must be an integer >= {}", where, k,
                lo);
    return j[k].get<int64_t>();
  };
  Campaign c;
  c.world = world;
  c.seed = uint64_t(integer("seed", 0, 0));
  int64_t first = integer("first_step", 12, 2), spacing = integer("spacing", 5, 2), tail = integer("tail", 6, 1);
  c.checkpoint_every = integer("checkpoint_every", 10, 1);
  ATOLL_CHECK(j.contains("faults") && j["faults"].is_array(), "{}: 'faults' must be an array", where);
  ATOLL_CHECK(!j["faults"].empty() || j.contains("steps"), "{}: a campaign without faults (a clean run) needs 'steps'",
              where);
  uint64_t rng = c.seed * 0x2545f4914f6cdd1dull + 1;
  int64_t prev = 0;
  int i = 0;
  for (auto& f : j["faults"]) {
    std::string at = fmt::format("{}: fault {}", where, i);
    ScheduledFault s;
    bool has_step = false;
    if (f.is_string()) {
      s.type = f.get<std::string>();
    } else {
      ATOLL_CHECK(f.is_object() && f.contains("type") && f["type"].is_string(),
                  "{}: must be a type name or an object with a 'type'", at);
      for (auto& [k, v] : f.items())
        ATOLL_CHECK(k == "type" || k == "rank" || k == "ranks" || k == "step",
                    "{}: unknown key '{}' (known: type, rank, ranks, step)", at, k);
      s.type = f["type"].get<std::string>();
      if (f.contains("rank")) {
        ATOLL_CHECK(f["rank"].is_number_integer(), "{}: 'rank' must be an integer", at);
        s.ranks = {f["rank"].get<int>()};
      }
      if (f.contains("ranks")) {
        ATOLL_CHECK(f["ranks"].is_array() && !f["ranks"].empty(), "{}: 'ranks' must be a non-empty array", at);
        for (auto& r : f["ranks"]) {
          ATOLL_CHECK(r.is_number_integer(), "{}: 'ranks' must hold integers", at);
          s.ranks.push_back(r.get<int>());
        }
      }
      if (f.contains("step")) {
        ATOLL_CHECK(f["step"].is_number_integer(), "{}: 'step' must be an integer", at);
        s.step = f["step"].get<int64_t>();
        has_step = true;
      }
    }
    fault_type(s.type);  // known?
    // Draw from the seed whatever the file leaves open (always draw, so that giving one fault's
    // rank does not move every later fault's).
    int drawn_rank = int(splitmix(rng) % uint64_t(world));
    int64_t jitter = int64_t(splitmix(rng) % 3);
    if (s.ranks.empty()) s.ranks = {drawn_rank};
    std::sort(s.ranks.begin(), s.ranks.end());
    s.ranks.erase(std::unique(s.ranks.begin(), s.ranks.end()), s.ranks.end());
    for (int r : s.ranks)
      ATOLL_CHECK(r >= 0 && r < world, "{} ({}): rank {} is outside a world of {}", at, s.type, r, world);
    if (!has_step) {
      s.step = prev == 0 ? first : prev + spacing + jitter;
      // A checkpoint write fails only where there is one: the next checkpoint step.
      if (s.type == "checkpoint_io_error") s.step = (s.step + c.checkpoint_every - 1) / c.checkpoint_every * c.checkpoint_every;
    }
    ATOLL_CHECK(s.step > prev, "{} ({}): step {} must come after the previous fault's step {}", at, s.type, s.step, prev);
    ATOLL_CHECK(s.step >= 2, "{} ({}): step must be >= 2", at, s.type);
    if (s.type == "checkpoint_io_error")
      ATOLL_CHECK(s.step % c.checkpoint_every == 0, "{} ({}): step {} is not a checkpoint step (every {})", at, s.type,
                  s.step, c.checkpoint_every);
    if (std::string(fault_type(s.type).family) == "checkpoint/storage" && s.type != "checkpoint_io_error")
      ATOLL_CHECK(s.step > c.checkpoint_every, "{} ({}): step {} comes before the first checkpoint (step {})", at,
                  s.type, s.step, c.checkpoint_every);
    s.index = i++;
    prev = s.step;
    c.faults.push_back(s);
  }
  c.steps = prev + tail;
  if (j.contains("steps")) {
    c.steps = integer("steps", 0, 1);
    ATOLL_CHECK(c.steps > prev, "{}: 'steps' ({}) must be past the last fault's step ({})", where, c.steps, prev);
  }
  return c;
}

Localization localize_by_majority(const std::vector<std::string>& v) {
  Localization l;
  const size_t n = v.size();
  std::map<std::string, std::vector<int>> groups;
  for (size_t r = 0; r < n; ++r) groups[v[r]].push_back(int(r));
  if (groups.size() <= 1) return l;
  for (auto& [val, rs] : groups)
    if (2 * rs.size() > n) {
      l.verdict = Localization::outlier;
      for (size_t r = 0; r < n; ++r)
        if (v[r] != val) l.ranks.push_back(int(r));
      return l;
    }
  l.verdict = Localization::inconclusive;
  return l;
}

Localization localize_by_accusations(const std::vector<std::vector<int>>& accused) {
  Localization l;
  const int n = int(accused.size());
  std::vector<std::set<int>> by(static_cast<size_t>(n));
  bool any = false;
  for (int r = 0; r < n; ++r)
    for (int x : accused[size_t(r)])
      if (x >= 0 && x < n && x != r) {
        by[size_t(x)].insert(r);
        any = true;
      }
  if (!any) return l;
  for (int x = 0; x < n; ++x)
    if (2 * int(by[size_t(x)].size()) > n) l.ranks.push_back(x);
  l.verdict = l.ranks.empty() ? Localization::inconclusive : Localization::outlier;
  return l;
}

CampaignScore score_campaign(const Campaign& c, const std::vector<Detection>& detections, int64_t window) {
  CampaignScore s;
  for (auto& f : c.faults) s.faults.push_back({f, "missed", {}});
  for (auto& d : detections) {
    if (d.where.verdict == Localization::clean) continue;
    FaultScore* owner = nullptr;
    for (auto& f : s.faults)
      if (f.fault.step <= d.step && d.step <= f.fault.step + window) owner = &f;
    if (owner)
      owner->detections.push_back(d);
    else
      s.false_positives.push_back(d);
  }
  for (auto& f : s.faults) {
    bool wrong = false, exact = false, inconclusive = false;
    for (auto& d : f.detections) {
      if (d.where.verdict == Localization::inconclusive)
        inconclusive = true;
      else if (d.where.ranks == f.fault.ranks)
        exact = true;
      else
        wrong = true;  // another rank, or an extra one
    }
    f.outcome = wrong ? "wrong" : exact ? "exact" : inconclusive ? "inconclusive" : "missed";
    (wrong ? s.wrong : exact ? s.exact : inconclusive ? s.inconclusive : s.missed)++;
  }
  return s;
}

static std::string join(const std::vector<int>& r) {
  std::string s;
  for (int x : r) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s.empty() ? "-" : s;
}

std::string format_score(const Campaign& c, const CampaignScore& s) {
  std::string out = fmt::format("fault-injection campaign: seed {}, {} ranks, {} steps, {} faults\n", c.seed, c.world,
                                c.steps, c.faults.size());
  out += fmt::format("{:<22} {:<21} {:>5} {:>8} {:>9} {:<13} {}\n", "type", "family", "step", "injected", "reported",
                     "outcome", "detector");
  for (auto& f : s.faults) {
    std::string reported, det;
    for (auto& d : f.detections) {
      std::string r = d.where.verdict == Localization::inconclusive ? "?" : join(d.where.ranks);
      if (reported.find(r) == std::string::npos) reported += (reported.empty() ? "" : " ") + r;
      if (det.find(d.detector) == std::string::npos) det += (det.empty() ? "" : ", ") + d.detector;
    }
    out += fmt::format("{:<22} {:<21} {:>5} {:>8} {:>9} {:<13} {}\n", f.fault.type, fault_type(f.fault.type).family,
                       f.fault.step, join(f.fault.ranks), reported.empty() ? "-" : reported, f.outcome,
                       det.empty() ? "-" : det);
  }
  out += fmt::format("exact {} / inconclusive {} / wrong {} / missed {} of {}; false positives {}\n", s.exact,
                     s.inconclusive, s.wrong, s.missed, s.faults.size(), s.false_positives.size());
  for (auto& d : s.false_positives)
    out += fmt::format("  false positive at step {}: {} {} {} ({})\n", d.step, d.detector, verdict_name(d.where.verdict),
                       join(d.where.ranks), d.detail);
  return out;
}

}  // namespace atl::resilience
